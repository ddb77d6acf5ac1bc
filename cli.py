"""Launcher for running the command line from a checkout: ``python cli.py ...``.

The installed command is ``lowprec-moe`` (``lowprec_moe.cli:main``); this file only forwards to
it, so no module named ``cli`` is ever installed.
"""

from lowprec_moe.cli import main

if __name__ == "__main__":
    main()
