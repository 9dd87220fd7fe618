"""Entry point of `python -m hints`."""
import sys

from .cli import main

sys.exit(main())
