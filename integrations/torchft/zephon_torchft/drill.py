"""One replica group of a live-elasticity drill: a tiny LM trained on CPU under a real torchft Manager.

    python -m zephon_torchft.drill --lighthouse ADDR --replica-id 0 --steps 20 --log r0.jsonl [options]

Each process is one replica group (one rank, gloo over loopback) that joins the quorum of the
lighthouse at ``--lighthouse``. With ``--loader zephon`` (the default) its data is Zephon's live
lanes through ``LiveData``, in torchft's order: ``zero_grad`` (the quorum), ``begin``, the
micro-batches (loss x weight, each gradient averaged by ``manager.allreduce``), ``exchange``,
``optimizer.step`` (``should_commit``), ``settle``. ``--loader torchft-sampler`` is the peer
baseline: torchft's ``DistributedSampler`` over the same documents, sharded by replica id over
``--max-groups`` groups, its position advancing at every attempt as in torchft's examples (and
kept per replica in ``--durable`` if given, as TorchTitan FT keeps its per-replica loader state).

``--log`` gets one JSON line per step attempt: ``replica``, ``step`` (the step committed, else the
step attempted), ``committed`` (None for the attempt a ``--die-at`` fault ended), ``quorum``,
``participants``, ``index``, and ``samples``: ``[lane, lane_index, digest]`` per batch (Zephon) or
the document indices (sampler); ``zephon_torchft.drill_log`` reads them back as committed steps.
Faults: ``--die-at S --die-when W`` ends the process with ``os._exit(1)`` at its first attempt of
step ``S``: ``before_allreduce`` (before any collective of the step), ``before_exchange`` (after the
gradients' allreduces, before the table's) or ``after_allreduce`` (after the table's, before
``should_commit``). ``--durable DIR`` writes ``live.checkpoint()`` as ``DIR/step-<S>.json`` every
``--durable-every`` committed steps (by the participant at index 0); ``--restore FILE`` starts from
one. Exit status: 0 done, 1 killed by a fault, 2 refused at start-up or at a step (one line on
stderr), 4 past ``--deadline``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sized
from datetime import timedelta
from pathlib import Path
from typing import IO, Any

import numpy as np
from torch.distributed import TCPStore
from torchft import Manager
from torchft.data import DistributedSampler
from torchft.optim import OptimizerWrapper
from torchft.process_group import ProcessGroupGloo

from zephon_core import ConfigError, Pipeline, ZephonError
from zephon_core.integration import Recipe, bundled_configs, load_recipe, load_tokenizer, write_atomically
from zephon_core.live import LiveLanes, live_data_problems
from zephon_torchft.drill_model import DocumentRows, TinyLM, batch_rows, build_model, train_attempt
from zephon_torchft.live import LiveData

FAULT_POINTS = ("before_allreduce", "before_exchange", "after_allreduce")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m zephon_torchft.drill", description=__doc__.split("\n\n")[0])
    p.add_argument("--lighthouse", required=True, help="the torchft lighthouse's address (LighthouseServer.address())")
    p.add_argument("--replica-id", type=int, required=True, help="this replica group's id (the sampler's shard)")
    p.add_argument("--steps", type=int, required=True, help="stop once this many steps are committed")
    p.add_argument("--log", required=True, help="JSONL file: one line per step attempt")
    p.add_argument("--loader", choices=("zephon", "torchft-sampler"), default="zephon")
    p.add_argument("--mode", choices=("sync", "async"), default="sync", help="torchft's quorum (use_async_quorum)")
    p.add_argument("--init-sync", action="store_true", help="async mode: build the Manager with init_sync=True "
                   "(refused by live mode); sync mode always uses torchft's default, True")
    p.add_argument("--min-replicas", type=int, default=2, help="the Manager's min_replica_size")
    p.add_argument("--recipe", default=str(bundled_configs() / "data" / "demo.toml"), help="a recipe with [standalone]")
    p.add_argument("--canonical-replicas", type=int, default=12, help="the lanes (C)")
    p.add_argument("--batches-per-lane", type=int, default=1, help="batches each lane delivers per step (k)")
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--max-groups", type=int, default=8, help="sampler: the most replica groups (num_replica_groups)")
    p.add_argument("--seed", type=int, default=0, help="the model's initial weights and the sampler's shuffle")
    p.add_argument("--die-at", type=int, default=None, help="end this process at its first attempt of this step")
    p.add_argument("--die-when", choices=FAULT_POINTS, default="before_allreduce")
    p.add_argument("--durable", default=None, help="folder of durable checkpoints (Zephon), loader states (sampler)")
    p.add_argument("--durable-every", type=int, default=4, help="committed steps between durable checkpoints")
    p.add_argument("--restore", default=None, help="a durable checkpoint (JSON) to start from")
    p.add_argument("--start-when", default=None, help="load everything, then wait for this file to exist before "
                   "joining the quorum (a joiner's launch then costs no import time)")
    p.add_argument("--pace", type=float, default=0.0, help="seconds to sleep after each attempt")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds for torchft's collectives and RPCs")
    p.add_argument("--deadline", type=float, default=150.0, help="give up (exit 4) after this many seconds")
    return p.parse_args(argv)


# -- data ------------------------------------------------------------------------------------
def load(args: argparse.Namespace) -> Recipe:
    overrides = {"canonical_replicas": args.canonical_replicas,
                 "standalone": {"seq_len": args.seq_len, "batch_size": args.batch_size}}
    return load_recipe(args.recipe, overrides)


def zephon_pipeline(args: argparse.Namespace, recipe: Recipe) -> Pipeline:
    """The recipe's pipeline for this group's one data-parallel rank, restored from ``--restore`` if given; a recipe
    with a ``[surgery]`` table is refused (``LiveLanes`` refuses a restored journal's skip still ahead)."""
    request = recipe.surgery()
    problems = live_data_problems(surgery=request.where if request else None)
    if problems:
        raise ConfigError("zephon live mode: " + problems[0])
    pipeline = recipe.build_standalone(dp_degree=1, dp_group_id=0)
    if args.restore:
        with open(args.restore, encoding="utf-8") as f:
            pipeline.restore(json.load(f))
    return pipeline


def vocab_size(recipe: Recipe) -> tuple[Any, int]:
    st = recipe.spec.standalone
    assert st is not None and st.tokenizer, "the drill's recipe needs a [standalone] tokenizer"
    tokenizer = load_tokenizer(recipe.resolve(st.tokenizer))
    return tokenizer, int(tokenizer.get_vocab_size())


# -- torchft ---------------------------------------------------------------------------------
def build_manager(args: argparse.Namespace, model: TinyLM, optim: Any) -> tuple[Any, TCPStore]:
    """This replica group's Manager (rank 0 of 1) over its own TCPStore, gloo on loopback."""
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)

    def save() -> dict[str, Any]:
        return {"model": model.state_dict(), "optim": optim.state_dict()}

    def restore(state: dict[str, Any]) -> None:
        model.load_state_dict(state["model"])
        optim.load_state_dict(state["optim"])

    timeout = timedelta(seconds=args.timeout)
    manager = Manager(
        pg=ProcessGroupGloo(timeout=timeout), load_state_dict=restore, state_dict=save,
        min_replica_size=args.min_replicas, use_async_quorum=args.mode == "async",
        init_sync=args.mode == "sync" or args.init_sync, replica_id=str(args.replica_id),
        lighthouse_addr=args.lighthouse, store_addr="127.0.0.1", store_port=store.port, rank=0, world_size=1,
        timeout=timeout, quorum_timeout=timedelta(seconds=3 * args.timeout), connect_timeout=timeout,
        heartbeat_interval=timedelta(milliseconds=100))
    return manager, store


class Drill:
    """The attempt log and the fault of one replica group."""

    def __init__(self, args: argparse.Namespace, manager: Any) -> None:
        self.args, self.manager = args, manager
        self._fd = os.open(args.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._tried: set[int] = set()
        self._first = False
        self._deadline = time.monotonic() + args.deadline

    def attempt(self, step: int) -> None:
        """A new attempt of ``step`` starts (after ``zero_grad``)."""
        if time.monotonic() > self._deadline:
            self.stop(f"past --deadline {self.args.deadline:g} s at step {step}", 4)
        self._first = step not in self._tried
        self._tried.add(step)

    def record(self, **fields: Any) -> dict[str, Any]:
        m = self.manager
        return {"replica": self.args.replica_id, "quorum": int(m._quorum_id), "torchft_step": m.current_step(),
                **fields}

    def write(self, record: dict[str, Any]) -> None:
        os.write(self._fd, (json.dumps(record) + "\n").encode())

    def fault(self, point: str, step: int, record: dict[str, Any]) -> None:
        """Die here if ``--die-at`` / ``--die-when`` say so (its line written first, ``committed`` None)."""
        if self.args.die_at == step and self.args.die_when == point and self._first:
            self.write({**record, "committed": None, "died": point})
            os._exit(1)

    def stop(self, message: str, code: int) -> None:
        print(f"zephon drill (replica {self.args.replica_id}): {message}", file=sys.stderr, flush=True)
        os._exit(code)


# -- the two loaders -------------------------------------------------------------------------
def run_zephon(args: argparse.Namespace, recipe: Recipe, model: TinyLM, optim: Any, manager: Any, drill: Drill) -> None:
    """Zephon's live lanes: every committed step holds each lane's batches of that step exactly once."""
    live = LiveLanes(zephon_pipeline(args, recipe), args.batches_per_lane)
    data = LiveData(live, manager)  # the start-up rules: ConfigError
    opt = OptimizerWrapper(manager, optim)
    shape = (args.batch_size, args.seq_len)
    while live.step < args.steps:
        opt.zero_grad()  # the quorum; in sync mode a lagging group heals here
        step = live.step
        drill.attempt(step)
        plan = data.begin()
        samples = [[b.lane, b.lane_index, b.digest] for b in plan.batches]
        record = drill.record(step=step, participants=plan.plan.participants, index=plan.plan.index, samples=samples)
        drill.fault("before_allreduce", step, record)
        micro = [(None if b is None else batch_rows(b.input_ids, b.labels, b.loss_mask), w)
                 for b, w in plan.microbatches()]
        train_attempt(model, manager, micro, shape)
        drill.fault("before_exchange", step, record)
        data.exchange()
        drill.fault("after_allreduce", step, record)
        opt.step()
        committed = data.settle()
        drill.write({**record, "step": live.step - 1 if committed else step, "committed": committed,
                     "torchft_step": manager.current_step()})
        if committed and args.durable and plan.plan.index == 0 and live.step % args.durable_every == 0:
            write_durable(Path(args.durable) / f"step-{live.step}.json", live.checkpoint())
        time.sleep(args.pace)
    live.close()


def write_durable(path: Path, state: dict[str, Any]) -> None:
    def write(f: IO[bytes]) -> None:
        f.write(json.dumps(state, sort_keys=True).encode())

    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, write)


class ShardOrder:
    """The peer's order of document indices: torchft's ``DistributedSampler`` for this replica id, epoch after epoch."""

    def __init__(self, args: argparse.Namespace, dataset: Sized) -> None:
        self.sampler = DistributedSampler(dataset, replica_rank=args.replica_id, num_replica_groups=args.max_groups,
                                          group_rank=0, num_replicas=1, shuffle=True, seed=args.seed, drop_last=True)
        self._epoch, self._order = -1, [0]

    def at(self, position: int) -> int:
        epoch, i = divmod(position, len(self.sampler))
        if epoch != self._epoch:
            self.sampler.set_epoch(epoch)
            self._epoch, self._order = epoch, list(self.sampler)
        return int(self._order[i])


def run_sampler(args: argparse.Namespace, recipe: Recipe, model: TinyLM, optim: Any, manager: Any,
                drill: Drill) -> None:
    """torchft's own sampler: the next batches of this replica's static shard at every attempt, committed or not."""
    src, st = recipe.spec.sources[0], recipe.spec.standalone
    assert st is not None and src.path, "the sampler drill reads one JSONL source of a recipe with [standalone]"
    tokenizer, _ = vocab_size(recipe)
    dataset = DocumentRows(recipe.resolve(src.path), src.text_field, tokenizer, args.seq_len, st.bos_id, st.eos_id)
    order, opt = ShardOrder(args, dataset), OptimizerWrapper(manager, optim)
    state_file = Path(args.durable) / f"sampler-{args.replica_id}.json" if args.durable else None
    position = json.loads(state_file.read_text())["position"] if state_file and state_file.exists() else 0
    per_step = args.batch_size * args.batches_per_lane
    while manager.current_step() < args.steps:
        opt.zero_grad()
        step = manager.current_step()
        drill.attempt(step)
        P, index = manager.num_participants(), manager.participating_rank() if manager.is_participating() else None
        picks = [order.at(position + i) for i in range(per_step)]
        position += per_step
        record = drill.record(step=step, participants=P, index=index, samples=picks)
        drill.fault("before_allreduce", step, record)
        B = args.batch_size
        n = len(range(0, per_step, B))
        micro = [(_stack([dataset[i] for i in picks[j : j + B]]), 1.0 / n) for j in range(0, per_step, B)]
        train_attempt(model, manager, micro, (args.batch_size, args.seq_len))
        drill.fault("before_exchange", step, record)
        drill.fault("after_allreduce", step, record)
        opt.step()
        committed = manager.current_step() > step
        drill.write({**record, "step": manager.current_step() - 1 if committed else step, "committed": committed,
                     "torchft_step": manager.current_step()})
        if state_file is not None:
            write_durable(state_file, {"position": position})
        time.sleep(args.pace)


def _stack(rows: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    return np.stack([r[0] for r in rows]), np.stack([r[1] for r in rows])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    recipe = load(args)
    _, vocab = vocab_size(recipe)
    model, optim = build_model(vocab, args.seed)
    while args.start_when and not os.path.exists(args.start_when):
        time.sleep(0.05)
    manager, _store = build_manager(args, model, optim)
    drill = Drill(args, manager)
    try:
        (run_zephon if args.loader == "zephon" else run_sampler)(args, recipe, model, optim, manager, drill)
    except ZephonError as e:
        drill.stop(str(e), 2)
    print(f"zephon drill (replica {args.replica_id}): done at step {args.steps}", file=sys.stderr, flush=True)
    sys.stderr.flush()
    os._exit(0)  # torchft's server threads and gloo's pairs need no orderly teardown here


if __name__ == "__main__":
    sys.exit(main())
