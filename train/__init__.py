"""What the training loop uses, one idea per module: the run's shared state (`run`), the process
and its log (`common`), the hint indexes' set-up (`hint_indexes`), training-time hint preparation
(`hint_prep`), validation with and without hints (`evaluate`), the warm-up (`warmup`), the loop's
sync points (`sync_points`), checkpoints (`checkpoint`), step timing (`meter`) and the run's
summary (`summary`). `train_gpt.py` at the repo root is the script that puts them together, the
outline of a run; nothing imports it."""
