"""The untimed warm-up: run a few training steps and a validation pass so that torch.compile
builds (and autotunes) their graphs before the clock starts, then undo them. The model and the
optimizers return to exactly their state before; the caller's loader and hint index are never
touched (the warm-up reads from its own)."""
import copy
import time


def warm_up_and_undo(model, optimizers, train_step, steps, evaluate, dist):
    """train_step(i) for i < steps, then evaluate(); restore model and optimizers; seconds taken."""
    t0 = time.perf_counter()
    saved_model = copy.deepcopy(model.state_dict())
    saved_opts = [copy.deepcopy(opt.state_dict()) for opt in optimizers]
    for i in range(steps):
        train_step(i)
    evaluate()
    dist.sync()
    model.load_state_dict(saved_model)
    for opt, state in zip(optimizers, saved_opts):
        opt.load_state_dict(state)
    return time.perf_counter() - t0
