"""What the training loop uses, one idea per module: the process and its log (`common`),
training-time hint preparation (`hint_prep`), validation with and without hints (`evaluate`),
checkpoints (`checkpoint`), and step timing and the summary (`meter`). `train_gpt.py` at the
repo root is the script that puts them together; nothing imports it."""
