import os

# An operation an Apple GPU (MPS) lacks runs on the CPU instead of failing. torch reads this when it
# is imported, so it is set here, before anything of the app imports torch; a user's own value stays.
os.environ.setdefault("PYTORCH_ENABLE_MPS_FALLBACK", "1")
