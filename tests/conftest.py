"""Test setup: import the repo's packages (hints, data, model, train_gpt) from the checkout."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
