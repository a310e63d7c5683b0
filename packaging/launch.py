"""Entry point for the PyInstaller bundle."""
from app.cli import main

raise SystemExit(main())
