"""Runs first in the bundle: the ninja the bundle carries goes on the PATH, where torch's
extension builder looks for it when the kernel is compiled on the user's machine."""
import os
import sys
from pathlib import Path

os.environ["PATH"] = os.pathsep.join([str(Path(sys._MEIPASS) / "bin"), os.environ.get("PATH", "")])
