"""In-process restart (``--inprocess-restart``): Megatron's own argument path and a restart of ``pretrain()`` on CPU.

megatron-core 0.19's ``inprocess_restart.maybe_wrap_for_inprocess_restart`` re-parses the
command line (``arguments.parse_args(ignore_unknown_args=True)``, looked up at call time)
and wraps ``pretrain`` in nvidia-resiliency-ext's ``inprocess.Wrapper``, whose finalize
(``destroy_state``) calls ``training.destroy_global_state``. nvidia-resiliency-ext is not
installed here and its wrapper needs NCCL, so ``FakeInprocess`` stands in for the names
Megatron's ``inprocess_restart()`` uses: it runs the wrapped function, and on an exception
aborts (destroys the process group), runs Megatron's finalize and runs it again with the
same arguments, as the real wrapper does. Everything else is Megatron's: the re-parse,
``inprocess_restart()`` building the wrapper from the parsed flags, its finalize, the
re-parse in ``ft_integration.setup()``, ``set_global_variables``, ``mpu`` (gloo, one rank),
``build_train_valid_test_datasets``, ``RerunDataIterator`` and ``maybe_save_dataloader_state``.
"""

from __future__ import annotations

import socket
import sys
import threading
import types
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
margs = pytest.importorskip("megatron.training.arguments")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")

import torch.distributed as dist  # noqa: E402

from zephon_megatron import args as zargs  # noqa: E402
from zephon_megatron import loader, plugin  # noqa: E402
from zephon_megatron.iterators import TrainStream  # noqa: E402

MBS, GBS, ITERS, SAVE_EVERY, FAULT_AFTER = 1, 4, 8, 2, 5

MODEL = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
         "--max-position-embeddings", "32", "--tokenizer-type", "NullTokenizer", "--vocab-size", "100",
         "--micro-batch-size", str(MBS), "--global-batch-size", str(GBS), "--train-iters", str(ITERS),
         "--eval-iters", "0", "--save-interval", str(SAVE_EVERY),
         "--async-strategy", "mcore"]  # Megatron's restart abort resets the async saver of this strategy


def _free_port() -> int:
    """A MASTER_PORT whose next port is free too (Megatron opens its restart store on MASTER_PORT + 1)."""
    for _ in range(50):
        with socket.socket() as a, socket.socket() as b:
            a.bind(("127.0.0.1", 0))
            port = int(a.getsockname()[1])
            try:
                b.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return port
    raise RuntimeError("no free pair of ports")


class _Part:
    """Any of the wrapper's parts that Megatron only constructs and hands over (rank assignment, checks, ...)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.kwargs = kwargs

    def __call__(self, state: Any) -> Any:
        return state


class _Compose:
    def __init__(self, *parts: Any) -> None:
        self.parts = parts

    def __call__(self, state: Any) -> Any:
        for part in self.parts:
            state = part(state)
        return state


class _ThreadedFinalize:
    def __init__(self, timeout: Any, fn: Any) -> None:
        self.timeout, self.fn, self.errors = timeout, fn, []

    def __call__(self, state: Any) -> Any:
        def run() -> None:
            try:
                self.fn()
            except BaseException as e:  # noqa: BLE001 - reported to the test below
                self.errors.append(e)

        t = threading.Thread(target=run)
        t.start()
        t.join(self.timeout.total_seconds())
        assert not t.is_alive() and not self.errors, self.errors
        return state


class _AbortTorchDistributed(_Part):
    def __call__(self, state: Any) -> Any:
        if dist.is_initialized():
            dist.destroy_process_group()
        return state


class FakeInprocess(types.ModuleType):
    """``nvidia_resiliency_ext.inprocess`` as far as megatron-core 0.19's ``inprocess_restart()`` uses it."""

    def __init__(self, max_attempts: int = 2) -> None:
        super().__init__("nvidia_resiliency_ext.inprocess")
        self.max_attempts = max_attempts
        self.wrapper_kwargs: dict[str, Any] = {}
        ns = types.SimpleNamespace
        self.rank_assignment = ns(Layer=_Part, Tree=_Part, LayerFlag=ns(RESERVE="reserve"))
        self.finalize = ns(ThreadedFinalize=_ThreadedFinalize)
        self.initialize = ns(RetryController=_Part)
        self.nested_restarter = ns(NestedRestarterHandlingCompleted=_Part, NestedRestarterHandlingStarting=_Part,
                                   NestedRestarterFinalized=_Part, NestedRestarterAborted=_Part)
        self.abort = ns(Abort=_Part, AbortTransformerEngine=_Part, AbortTorchDistributed=_AbortTorchDistributed)
        self.state = ns(FrozenState=object)
        self.health_check = ns(CudaHealthCheck=_Part)
        self.Compose = _Compose
        self.faults: list[BaseException] = []

    def Wrapper(self, **kwargs: Any) -> Any:  # noqa: N802 - the real name
        self.wrapper_kwargs = kwargs

        def wrap(fn: Any) -> Any:
            def restarting(*args: Any, **kw: Any) -> Any:
                for attempt in range(self.max_attempts):
                    try:
                        return fn(*args, **kw, inprocess_call_wrapper=types.SimpleNamespace(iteration=attempt))
                    except Exception as e:
                        self.faults.append(e)
                        if attempt + 1 == self.max_attempts:
                            raise
                        kwargs["abort"](attempt)
                        kwargs["finalize"](attempt)
                return None

            return restarting

        return wrap


def _fresh_process() -> None:
    """As a new process would be: no loader, no Megatron globals, no process groups."""
    import megatron.training.training as mtt
    from megatron.core import mpu

    loader.close_current()
    mtt.destroy_global_state()
    if mpu.model_parallel_is_initialized():
        mpu.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()
    plugin._SCRIPT_ARGS["args"] = None


@pytest.fixture()
def megatron_process(monkeypatch):
    """One rank's process: the adapter installed (undone afterwards), Megatron's globals clean before and after."""
    import megatron.training as mt
    import megatron.training.checkpointing as mck
    import megatron.training.training as mtt

    for module, name in [(margs, "add_megatron_arguments"), (margs, "parse_args"), (mt, "pretrain"),
                         (mtt, "pretrain"), (mck, "maybe_save_dataloader_state"), (mtt, "dummy_train_step"),
                         (mtt, "training_log"), (mtt, "destroy_global_state")]:
        monkeypatch.setattr(module, name, getattr(module, name))
    monkeypatch.setitem(plugin._SCRIPT_ARGS, "args", None)
    monkeypatch.setitem(loader._CURRENT, "loader", None)
    monkeypatch.setitem(loader._CURRENT, "args", None)
    for k, v in dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE="1", RANK="0",
                     LOCAL_RANK="0").items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("ZEPHON_BATCH_LOG", raising=False)
    _fresh_process()
    yield
    _fresh_process()


@pytest.fixture()
def closed(monkeypatch) -> list[TrainStream]:
    """The training streams closed during the test, in order."""
    seen: list[TrainStream] = []
    close = TrainStream.close
    monkeypatch.setattr(TrainStream, "close", lambda self: (seen.append(self), close(self))[-1])
    return seen


def _recipe(tmp_path) -> str:
    rng = np.random.default_rng(11)
    lengths = rng.integers(3, 40, size=400)
    np.save(tmp_path / "tokens.npy", rng.integers(2, 99, size=int(lengths.sum())).astype(np.int32))
    np.save(tmp_path / "offsets.npy", np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))
    recipe = tmp_path / "train.toml"
    recipe.write_text('seed = 3\nchunk_size = 4\ncanonical_replicas = 2\n\n[[sources]]\npath = "tokens.npy"\n'
                      'offsets = "offsets.npy"\nformat = "token_array"\n\n[shuffle]\nwindow = 4\nseed = 1\n')
    return str(recipe)


def _argv(tmp_path, run: str) -> list[str]:
    return ["pretrain_gpt.py", *MODEL, "--dataloader-type", "zephon", "--zephon-recipe", _recipe(tmp_path),
            "--dataloader-save", str(tmp_path / run / "loader"), "--zephon-run-id", run, "--inprocess-restart"]


class StandInPretrain:
    """megatron-core 0.19's ``pretrain()`` reduced to what touches the data: its signature and, per attempt,
    the re-parse of ``ft_integration.setup()``, ``get_args()``, the process groups, the reload of the last
    checkpoint (its iteration and consumed samples), Megatron's dataset build with the provider it is given, a
    loop that reads one step of micro-batches per iteration, and the loader-state save with each checkpoint."""

    def __init__(self, fault_after: int | None) -> None:
        self.fault_after = fault_after
        self.checkpoint = {"iteration": 0, "consumed": 0}
        self.steps: list[tuple[int, int, list[Any]]] = []  # (attempt, iteration, the step's batch identities)
        self.streams: list[TrainStream] = []
        self.args_seen: list[Any] = []
        self.loader_at_entry: list[Any] = []  # the adapter's loader when an attempt begins

    def __call__(self, cfg_container, train_valid_test_dataset_provider, model_type, forward_step_func,
                 model_provider=None, store=None, inprocess_call_wrapper=None):
        from megatron.core import mpu
        from megatron.core.num_microbatches_calculator import get_num_microbatches
        from megatron.core.rerun_state_machine import RerunDataIterator
        from megatron.training import checkpointing, ft_integration, get_args, training

        attempt = inprocess_call_wrapper.iteration if inprocess_call_wrapper is not None else 0
        self.loader_at_entry.append(loader._CURRENT["loader"])
        ft_integration.setup()
        args = get_args()
        self.args_seen.append(args)
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        mpu.initialize_model_parallel()
        args.iteration, args.consumed_train_samples = self.checkpoint["iteration"], self.checkpoint["consumed"]
        train, _, _ = training.build_train_valid_test_datasets(train_valid_test_dataset_provider)
        self.streams.append(loader._CURRENT["loader"].stream)
        it = RerunDataIterator(train)
        for iteration in range(args.iteration + 1, args.train_iters + 1):
            self.steps.append((attempt, iteration, [next(it).meta for _ in range(get_num_microbatches())]))
            args.consumed_train_samples += args.global_batch_size
            if iteration % args.save_interval == 0:
                checkpointing.maybe_save_dataloader_state(it, iteration, args.dataloader_save)
                self.checkpoint = {"iteration": iteration, "consumed": args.consumed_train_samples}
            if attempt == 0 and iteration == self.fault_after:
                raise RuntimeError(f"injected fault after iteration {iteration}")


def _run(monkeypatch, tmp_path, run: str, fault_after: int | None) -> tuple[StandInPretrain, FakeInprocess]:
    """The checkout's pretrain_gpt.py ``__main__`` as megatron-core 0.19 writes it, through the adapter's launcher."""
    from megatron.core.enums import ModelType
    from megatron.training import inprocess_restart

    nvrx = FakeInprocess()
    monkeypatch.setenv("MASTER_PORT", str(_free_port()))
    monkeypatch.setitem(sys.modules, "nvidia_resiliency_ext", types.ModuleType("nvidia_resiliency_ext"))
    monkeypatch.setitem(sys.modules, "nvidia_resiliency_ext.inprocess", nvrx)
    monkeypatch.setattr(sys, "argv", _argv(tmp_path, run))
    stand_in = StandInPretrain(fault_after)
    import megatron.training.training as mtt

    monkeypatch.setattr(mtt, "pretrain", stand_in)
    plugin.install()  # what zephon_megatron.launch does before it runs the script
    from megatron.training import pretrain  # the script's import, after the install

    pretrain, store = inprocess_restart.maybe_wrap_for_inprocess_restart(pretrain)
    margs.parse_and_validate_args(args_defaults={"tokenizer_type": "GPT2BPETokenizer"})
    pretrain("cfg", "the script's own provider", ModelType.encoder_or_decoder, "forward_step", store=store)
    return stand_in, nvrx


def test_the_inprocess_restart_reparse_keeps_zephons_flags(monkeypatch, megatron_process, tmp_path):
    """``maybe_wrap_for_inprocess_restart`` parses argv itself, without the script's provider: Zephon's choice and
    flags survive it, and its flags (--inprocess-*) are the ones the wrapper is built from."""
    from megatron.training import inprocess_restart

    seen = []
    monkeypatch.setattr(inprocess_restart, "inprocess_restart", lambda train, args: seen.append(args) or train)
    monkeypatch.setattr(sys, "argv", [*_argv(tmp_path, "r"), "--inprocess-active-world-size", "1"])
    original = getattr(margs.parse_args, "__wrapped__", margs.parse_args)
    monkeypatch.setattr(margs, "parse_args", original)
    monkeypatch.setattr(margs, "add_megatron_arguments", getattr(margs.add_megatron_arguments, "__wrapped__",
                                                                 margs.add_megatron_arguments))
    with pytest.raises(SystemExit):  # stock megatron-core: "invalid choice: 'zephon'"
        inprocess_restart.maybe_wrap_for_inprocess_restart(lambda: None)
    zargs.install_arguments()
    _, store = inprocess_restart.maybe_wrap_for_inprocess_restart(lambda: None)
    assert store is not None and len(seen) == 1
    ns = seen[0]
    assert (ns.dataloader_type, ns.zephon_recipe, ns.dataloader_save, ns.zephon_run_id) == (
        "zephon", str(tmp_path / "train.toml"), str(tmp_path / "r" / "loader"), "r")
    assert ns.inprocess_restart and ns.inprocess_active_world_size == 1


def _reference(monkeypatch, tmp_path) -> dict[int, list[Any]]:
    stand_in, nvrx = _run(monkeypatch, tmp_path, "reference", fault_after=None)
    assert not nvrx.faults and [a for a, _, _ in stand_in.steps] == [0] * ITERS
    return {i: metas for _, i, metas in stand_in.steps}


def test_an_inprocess_restart_resumes_the_loader_from_the_reloaded_checkpoint(monkeypatch, megatron_process, closed,
                                                                               tmp_path):
    """A fault after iteration 5 (last checkpoint: 4): Megatron's wrapper (built from the re-parse with Zephon's
    flags) finalizes and runs pretrain() again; the first attempt's Pipeline is closed, the arguments are the
    script's again, and iterations 5.. read exactly what an uninterrupted run reads."""
    reference = _reference(monkeypatch, tmp_path)
    _fresh_process()
    closed.clear()

    stand_in, nvrx = _run(monkeypatch, tmp_path, "restarted", fault_after=FAULT_AFTER)

    assert [str(e) for e in nvrx.faults] == [f"injected fault after iteration {FAULT_AFTER}"]
    assert nvrx.wrapper_kwargs["finalize"] is not None  # Megatron built its wrapper from the re-parsed flags
    assert [(a, i) for a, i, _ in stand_in.steps] == [(0, i) for i in range(1, FAULT_AFTER + 1)] + [
        (1, i) for i in range(FAULT_AFTER, ITERS + 1)]
    first, second = stand_in.streams
    assert closed[:1] == [first] and stand_in.loader_at_entry == [None, None]  # closed by the restart's finalize
    assert second.start_iteration == 4 and second.pipeline is not first.pipeline
    a0, a1 = stand_in.args_seen
    assert a1 is not a0 and a1.zephon_recipe == a0.zephon_recipe and a1.dataloader_type == "external"
    for attempt, iteration, metas in stand_in.steps:
        assert metas == reference[iteration], (attempt, iteration)


def test_building_the_loader_again_in_one_process_closes_the_first(monkeypatch, megatron_process, closed, tmp_path):
    """Without the finalize hook (say it timed out), the provider's next build still closes the stale loader,
    and the new one resumes from the saved state: the same batches as an uninterrupted run."""
    from megatron.core import mpu
    from megatron.core.num_microbatches_calculator import get_num_microbatches
    from megatron.training import checkpointing, get_args, training

    monkeypatch.setattr(sys, "argv", _argv(tmp_path, "twice"))
    zargs.install_arguments()

    def build(iteration: int) -> Any:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        mpu.initialize_model_parallel()
        margs.parse_and_validate_args()
        args = get_args()
        args.iteration, args.consumed_train_samples = iteration, iteration * GBS
        train, _, _ = loader.train_valid_test_datasets_provider(None)
        return args, train

    def step(it: Any) -> list[Any]:
        return [next(it).meta for _ in range(get_num_microbatches())]

    args, first = build(0)
    stream = loader._CURRENT["loader"].stream
    for _ in range(4):
        step(first)
    checkpointing.maybe_save_dataloader_state(types.SimpleNamespace(iterable=first), 4, args.dataloader_save)
    later = [step(first) for _ in range(3)]
    assert not closed

    training.destroy_global_state()  # Megatron's restart finalize, without the adapter's hook (not installed here)
    dist.destroy_process_group()
    _, second = build(4)
    assert closed == [stream] and loader._CURRENT["loader"].stream is not stream
    assert [step(second) for _ in range(3)] == later
