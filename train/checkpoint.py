"""Checkpoints: one consistent set of files per save, loaded without running code.

A checkpoint at PATH is a set:
  PATH                 rank 0: model, rank 0's optimizer states, loader, hint-stream tail, RNG,
                       progress, the run's settings
  PATH.rank<r>         rank r > 0: its optimizer states (Muon shards them) and RNG
  PATH.hints           the training-time hint index (identical on every rank; rank 0 writes it)
  PATH.manifest.json   written last: step, world size and, for every file above, size and SHA-256

Saving removes the old manifest first, writes each file to a temporary name, fsyncs it and
renames it into place; rank 0 writes the manifest only after every rank has written its file.
A crash at any point leaves either the old complete set or no manifest, and `load_set` refuses
a set without a manifest or with any file whose size or hash disagrees, naming the file.

Everything is loaded with `torch.load(weights_only=True)`: a checkpoint holds only tensors,
numbers, strings, lists and dicts (NumPy and Python RNG states are stored as such), so loading
one cannot execute code hidden in it.
"""
import dataclasses
import hashlib
import json
import os
import random

import numpy as np
import torch

from data.loader import resolve_files
from hints import HintIndex

FORMAT = 2  # 2: manifest + weights_only contents (1 pickled NumPy arrays and needed weights_only=False)
HASH_BLOCK = 1 << 24  # bytes read at a time when hashing a file
# Bytes of each training shard, at its start, middle and end, that its fingerprint hashes: the
# whole of a small shard, and a sample of a 200 MB FineWeb one that any re-tokenisation changes.
FINGERPRINT_SAMPLE = 1 << 20


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed: the message names the file and what disagrees."""


def paths(path, rank):
    """(main file, this rank's side file or None, hint index file, manifest)."""
    return path, (f"{path}.rank{rank}" if rank > 0 else None), f"{path}.hints", f"{path}.manifest.json"


def step_path(path, step, final):
    """PATH for the final save, PATH_stepNNNNNN.ext for one every --checkpoint-every steps."""
    if final:
        return path
    root, ext = os.path.splitext(path)
    return f"{root}_step{step:06d}{ext}"


# -- RNG state as plain data -------------------------------------------------------------------

def rng_state():
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = dict(torch=torch.get_rng_state(),
                 numpy=[kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)],
                 python=list(random.getstate()))
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state):
    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def param_digest(model):
    """SHA-256 of every parameter's bytes: equal on all ranks iff they hold the same weights."""
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def shard_fingerprints(files):
    """[name, bytes, hash of sampled bytes] per shard: a resume on other shard contents is refused."""
    out = []
    for f in files:
        size = os.path.getsize(f)
        h = hashlib.sha256()
        with open(f, "rb") as fh:
            for at in sorted({0, max(0, size // 2 - FINGERPRINT_SAMPLE // 2), max(0, size - FINGERPRINT_SAMPLE)}):
                fh.seek(at)
                h.update(fh.read(FINGERPRINT_SAMPLE))
        out.append([os.path.basename(f), size, h.hexdigest()[:16]])
    return out


# -- files ---------------------------------------------------------------------------------------

def file_sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(HASH_BLOCK):
            h.update(block)
    return h.hexdigest()


def _fsync_dir(path):
    fd = os.open(os.path.dirname(os.path.abspath(path)) or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _replace_durably(tmp, path):
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path)


def _write_torch(obj, path):
    tmp = f"{path}.tmp"
    try:
        torch.save(obj, tmp)
        _replace_durably(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _load_torch(path):
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint file {path} is missing") from None
    except Exception as e:  # noqa: BLE001 - pickle refusals and corrupt zips come in many types
        raise CheckpointError(f"checkpoint file {path} cannot be loaded safely "
                              f"(weights_only: tensors, numbers, strings, lists and dicts only): "
                              f"{str(e).splitlines()[0][:300]}") from None


def save(path, step, d, *, main_state, rank_state, index):
    """Write this rank's part of the set at `path`; rank 0 adds the hint index and, once every
    rank is done, the manifest. `main_state` is rank 0's dict, `rank_state` every other rank's."""
    main_path, side_path, index_path, manifest_path = paths(path, d.rank)
    if d.master:
        os.makedirs(os.path.dirname(os.path.abspath(main_path)), exist_ok=True)
        if os.path.exists(manifest_path):
            os.unlink(manifest_path)  # from here until the new manifest, the set reads as incomplete
    d.barrier()
    mine = main_path if d.master else side_path
    _write_torch(dict(format=FORMAT, step=step, **(main_state if d.master else rank_state)), mine)
    entries = {os.path.basename(mine): [os.path.getsize(mine), file_sha256(mine)]}
    if d.master and index is not None:
        index.save(index_path)
        with open(index_path, "rb+") as f:
            os.fsync(f.fileno())
        entries[os.path.basename(index_path)] = [os.path.getsize(index_path), file_sha256(index_path)]
    everyone = d.gather(entries)
    if d.master:
        files = {name: dict(bytes=size, sha256=digest) for part in everyone for name, (size, digest) in part.items()}
        manifest = dict(format=FORMAT, step=step, world_size=d.world_size, files=files)
        tmp = f"{manifest_path}.tmp"
        with open(tmp, "w") as f:
            json.dump(manifest, f, indent=1)
        _replace_durably(tmp, manifest_path)
    d.barrier()
    return main_path


def load_set(path, d):
    """(rank 0's state, this rank's state, hint index path or None) of a complete checkpoint set.

    Raises CheckpointError naming the file when the manifest is missing, or a file is missing,
    of another size or hash, or at another step than the manifest says."""
    main_path, side_path, index_path, manifest_path = paths(path, d.rank)
    try:
        with open(manifest_path) as f:
            manifest = json.load(f)
    except FileNotFoundError:
        raise CheckpointError(f"--resume {path}: no manifest {manifest_path}; the set is incomplete "
                              f"(a save was interrupted, or this is not a checkpoint of this trainer)") from None
    except ValueError as e:
        raise CheckpointError(f"--resume {path}: manifest {manifest_path} is not valid JSON ({e})") from None
    if manifest.get("format") != FORMAT:
        raise CheckpointError(f"--resume {path}: manifest format {manifest.get('format')}, expected {FORMAT}")
    if manifest["world_size"] != d.world_size:
        raise CheckpointError(f"--resume {path}: saved with {manifest['world_size']} ranks, running {d.world_size}")
    needed = [main_path] + ([side_path] if side_path else [])
    for f in needed + ([index_path] if os.path.basename(index_path) in manifest["files"] else []):
        entry = manifest["files"].get(os.path.basename(f))
        if entry is None:
            raise CheckpointError(f"--resume {path}: {f} is not in the manifest {manifest_path}")
        if not os.path.exists(f):
            raise CheckpointError(f"--resume {path}: {f} is missing (the manifest lists it)")
        size = os.path.getsize(f)
        if size != entry["bytes"] or file_sha256(f) != entry["sha256"]:
            raise CheckpointError(f"--resume {path}: {f} is not the file the manifest {manifest_path} lists "
                                  f"({size:,} bytes now, {entry['bytes']:,} saved, or another SHA-256): "
                                  f"the set is mixed from different saves")
    main = _load_torch(main_path)
    mine = main if d.master else _load_torch(side_path)
    for f, state in ((main_path, main), (side_path, mine)):
        if state.get("format") != FORMAT or state.get("step") != manifest["step"]:
            raise CheckpointError(f"--resume {path}: {f} holds step {state.get('step')}, the manifest step "
                                  f"{manifest['step']}")
    has_index = os.path.basename(index_path) in manifest["files"]
    return main, mine, index_path if has_index else None


def check_settings(path, saved, current):
    """Refuse a resume whose settings differ from the saved run's: names each one, old and new."""
    diffs = [f"{k}: saved {saved.get(k)!r}, now {v!r}" for k, v in current.items() if saved.get(k) != v]
    if diffs:
        raise CheckpointError(f"--resume {path}: settings differ from the saved run: " + "; ".join(diffs))


def load_index(index_path, expected_tokens, workers):
    """The saved training index, which must hold exactly the tokens of the steps trained."""
    index = HintIndex.load(index_path, mmap=False, workers=workers)
    if index.tokens_added != expected_tokens:
        raise CheckpointError(f"--resume: {index_path} holds {index.tokens_added:,} tokens, but the steps "
                              f"saved account for {expected_tokens:,} (step x global batch): hints would leak "
                              f"or be missing")
    return index


def save_run(path, step, d, *, model, optimizers, loader, index, tail, progress, settings, args):
    """Checkpoint a training run at `step`: the model and loader once (rank 0), every rank's
    optimizer states and RNG, the training index, the hint stream's tail, the meter's progress."""
    rank_state = dict(optimizers=[opt.state_dict() for opt in optimizers], rng=rng_state())
    main_state = dict(rank_state, world_size=d.world_size, settings=settings, args=vars(args),
                      model_config=dataclasses.asdict(model.cfg), model=model.state_dict(),
                      loader=loader.state_dict(), hint_tail=torch.from_numpy(np.asarray(tail, np.int64)),
                      progress=progress)
    return save(path, step, d, main_state=main_state, rank_state=rank_state, index=index)


def restore_run(path, d, *, settings, model, optimizers, loader, index, global_batch, hint_workers):
    """Load a checkpoint set into the run's objects after checking it is whole and made with the
    same settings. Returns (step, training index, hint stream tail, meter progress)."""
    main, mine, index_path = load_set(path, d)
    check_settings(path, main["settings"], settings)
    model.load_state_dict(main["model"])
    for opt, state in zip(optimizers, mine["optimizers"]):
        opt.load_state_dict(state)
    loader.load_state_dict(main["loader"])
    tail = None
    if index is not None:
        if index_path is None:
            raise CheckpointError(f"--resume {path}: the set has no hint index (saved with --no-hints?)")
        index = load_index(index_path, main["step"] * global_batch, hint_workers)
        tail = main["hint_tail"].numpy().astype(np.uint16)
    set_rng_state(mine["rng"])
    return main["step"], index, tail, main["progress"]


def run_settings(args, cfg, geom, train_files):
    """What a resumed run must share with the saved one (check_settings compares them)."""
    return dict(model_config=dataclasses.asdict(cfg), hint_lengths=list(args.hint_lengths),
                train_index_geometry=geom.to_dict() if geom else None, seq_len=args.seq_len, batch_size=args.batch_size,
                steps=args.steps, train_shards=shard_fingerprints(resolve_files(train_files)))
