"""``batch_size="auto"``: the batch size a run samples with, decided before it starts.

A device advances its chains one after another (``batch_size=1``) or together in
vmaps (``8``: vmaps of 8 chains; ``None``: one over all). The choice is made once, in
the ``place`` stage, from facts that are the same every time the same call runs: the
device kind, the chains per device, the run's length, the JAX version and the cost of
one kernel step (``step_flops``: the arithmetic of the step's jaxpr, a while loop's body
counted once, read from the one trace of the step the run makes anyway). Never a
timing: the same script with the same seed gives the same batch size, and so the same
draws, in every process. The same facts give the chunk program's XLA options
(``compile_options``), and from those, the device kind and the JAX version, the init
program's (``init_compile_options``).

The rule (``docs/batch-size.md`` has the measurements behind each constant):

- an explicit ``batch_size`` is used as given; an ensemble takes its own width
  (``_ensemble.auto_width``); a continued trace its trace's batch size;
- GPU and TPU: one ``vmap`` over a device's chains (``1`` with one chain per device);
- CPU: ``1``, unless a ``vmap`` is expected to sample
  faster (``expected_speedup``) **and** the time it would save on the run's estimated
  sampling time with ``1`` (``estimate``) is more than the extra compile of a vmapped
  program (``VMAP_COMPILE_S``). A vmap is expected to be faster where one step is
  matrix work (``MATRIX_FLOPS`` or more: a vmap turns matrix-vector products into
  matrix-matrix ones), or, on jax older than 0.11, where a device holds
  ``SMALL_MODEL_WIDTH`` chains or more (per-op overhead amortised; priced higher,
  ``MACHINE_SPEEDUP``, where blackjax's NUTS runs as the state machine; on jax 0.12 a
  vmap of a small model measured 0.3-0.4x the speed of ``1``, the machine 0.37-0.71x).
  Matrix work takes vmaps of ``WIDEST`` chains where a device holds more; a small model
  one vmap of all.

The choice and the facts it came from go to ``attrs["batch_size_choice"]``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
from jax.sharding import Mesh

from ..layout import _mesh
from . import _ensemble
from ._jaxpr import flops
from ._programs import kernel_step

VMAP_COMPILE_S = 3.0
"""Seconds a vmapped NUTS program compiles longer than the ``1`` program on CPU (measured
1.5-3.7 s on the grid of ``bench_batch_size.py``, both JAX versions)."""
MATRIX_SPEEDUP = 1.2
"""A vmap's expected speed over ``1`` on a step of matrix work (the grid's logistic
regression and matmul rows: 0.83-1.71x, 1.3x on the long matmul run of 4000 + 4000)."""
SMALL_MODEL_SPEEDUP = 1.4
"""On jax < 0.11, a vmap's expected speed over ``1`` on a small model with
``SMALL_MODEL_WIDTH`` chains per device or more (the grid: 1.1-1.7x)."""
MACHINE_SPEEDUP = 1.6
"""On jax < 0.11, the expected speed over ``1`` of a vmap that runs blackjax's NUTS as the
state machine (``Kernel.machine``: no chain waits for the batch's longest trajectory) on
a small model with ``SMALL_MODEL_WIDTH`` chains per device or more
(``bench_nuts_fsm.py``, ``cr.run`` against ``batch_size=1``, 2 devices: 1.65-2.0x at 8
chains per device, 2.5-3.1x at 32, fixed, window-adapted and Fisher-adapted; its program
compiles 2.5-2.8 s longer than ``1``'s, within ``VMAP_COMPILE_S``)."""
MATRIX_FLOPS = 5e4
"""Flops of one kernel step from which the step is matrix work a vmap speeds up (the
grid's logistic regression 5000x20 and matmul models: 2.7e5 to 4.7e5; eight schools and
the 50-d Gaussian: under 2e4)."""
SMALL_MODEL_WIDTH = 8
"""On jax < 0.11, chains per device from which a vmap of a small model samples faster
(measured 1.1-1.7x at 8 to 2048 chains per device; 0.7-0.9x at 1 to 4)."""
STEP_OVERHEAD_S = {True: 25e-6, False: 6e-6}
"""Seconds one chain's step costs a device beyond its flops, on jax < 0.11 (``True``)
and later: the grid's eight schools, 23-47 and 5-12 microseconds per chain-step."""
FLOPS_PER_S = 1.2e9
"""A device's rate on a step's flops (the grid's logistic regression: about 400
microseconds per chain-step for 4.7e5 flops)."""
WIDEST = 8
"""A step of matrix work with more chains per device: vmaps of this many (8 was faster
than one vmap of all on the grid's logistic and matmul rows at 64 and 4096 chains). A
small model on jax < 0.11 takes one vmap of all: on the long rows of 64 chains on 2
devices, 1.6-1.8x the speed of vmaps of 8 (``benchmarks/results/batch_size-long-rows.json``)."""


class Choice(NamedTuple):
    """A run's batch size and why (the facts it was decided from)."""

    batch_size: int | None
    reason: str


def _old_jax() -> bool:
    return tuple(int(p) for p in jax.__version__.split(".")[:2]) < (0, 11)


def choose(plan: Any, start: Any, mesh: Mesh) -> Choice:
    """The batch size a run samples with (the ``place`` stage), decided once."""
    n = start.num_chains
    if plan.batch_size != "auto":
        return Choice(plan.batch_size, "given")
    if start.kernel.ensemble is not None:
        return Choice(*_ensemble.auto_width(n))
    if mesh.devices.flat[0].platform != "cpu":  # accelerators: one vmap
        return Choice(*_mesh.auto_batch_size("auto", mesh, n))
    if start.previous_batch_size is not None:  # continuing: one longer run's layout
        b = None if start.previous_batch_size == "all" else int(start.previous_batch_size)
        return Choice(b, f"auto: {start.previous_batch_size}, as the continued trace")
    if start.cross_chain:
        return Choice(1, "auto: 1, chains one after another on CPU (after a cross-chain warmup)")
    return on_cpu(plan, start, mesh)


def on_cpu(plan: Any, start: Any, mesh: Mesh) -> Choice:
    """``1`` or a vmap on CPU devices, by the rule of the module docstring."""
    per_device = -(-start.num_chains // mesh.shape[_mesh.AXIS])
    steps = (0 if start.cross_chain else plan.num_warmup) + plan.num_samples
    old = _old_jax()
    flops = step_flops(start)
    if flops is None:
        return Choice(1, _one("the step's cost is unknown (its trace failed)"))
    seconds = estimate(steps, per_device, flops, old)
    facts = (
        f"{steps} steps x {per_device} chains per device, {flops:.3g} flops a step: about "
        f"{seconds:.3g} s with 1 at the rule's rates"
    )
    # the machine runs where a vmap runs the chunk without thinning (``chunk_loop``)
    machine = start.kernel.machine is not None and plan.thinning == 1
    speedup = expected_speedup(flops, per_device, old, machine)
    if speedup is None:
        why = "" if old else f", under {MATRIX_FLOPS:.0e} flops on jax >= 0.11"
        return Choice(1, _one(f"{facts}; a vmap is not faster{why}"))
    saved = seconds * (1 - 1 / speedup)
    as_machine = machine and flops < MATRIX_FLOPS
    at = f"{speedup:g}x{' (NUTS as the state machine)' if as_machine else ''}"
    than = f"{saved:.2g} s at {at}, {'more' if saved >= VMAP_COMPILE_S else 'less'} " \
           f"than its {VMAP_COMPILE_S:g} s compile"  # fmt: skip
    if saved < VMAP_COMPILE_S:
        return Choice(1, _one(f"{facts}; a vmap would save about {than}"))
    # Matrix work: vmaps of WIDEST; a small model's per-op overhead: one vmap of all
    width = WIDEST if per_device > WIDEST and flops >= MATRIX_FLOPS else None
    named = "all, one vmap" if width is None else f"{width}, vmaps of {width} chains"
    return Choice(width, f"auto: {named} ({facts}; a vmap saves about {than})")


def expected_speedup(
    flops: float, per_device: int, old_jax: bool, machine: bool = False
) -> float | None:
    """How much faster a vmap is expected to sample than ``1`` (``None``: not faster);
    ``machine``: the kernel runs as NUTS's state machine when vmapped."""
    if flops >= MATRIX_FLOPS:
        return MATRIX_SPEEDUP
    if old_jax and per_device >= SMALL_MODEL_WIDTH:
        return MACHINE_SPEEDUP if machine else SMALL_MODEL_SPEEDUP
    return None


def compile_options(start: Any, mesh: Mesh, batch_size: int | None) -> tuple:
    """XLA's options for the chunk program (items of ``Lowered.compile``'s
    dict): a fact of the layout, the step and the JAX version, never a timing. Chains one
    after another on CPU (``1``) whose step is no matrix work compile with less
    optimisation, where it cost their sampling nothing measurable (``bench_layout.py``'s
    rows: 2 CPU devices, NUTS, the first call with the cache off): on jax >= 0.11, LLVM's
    level 1 (the chunk program 0.4 to 0.55 s faster to compile on eight schools, fixed and
    window-adapted, and the 50-d Gaussian, sampling within 3 %; a PyMC eight schools'
    first ``cr.sample`` 7.0 to 6.2 s); on jax 0.10, XLA's older emitters for fusions (0.35
    to 0.55 s faster, sampling within 6 %). Matrix work and vmaps keep XLA's defaults: the
    logistic regression with ``1`` sampled 8 % slower at level 1, a vmapped 50-d Gaussian
    13-46 % slower with either. Accelerators keep theirs."""
    cpu = mesh.devices.flat[0].platform == "cpu"
    if not cpu or batch_size != 1 or start.cross_chain or start.kernel.ensemble is not None:
        return ()
    flops = step_flops(start)
    if flops is None or flops >= MATRIX_FLOPS:
        return ()
    if _old_jax():
        return (("xla_cpu_use_fusion_emitters", False),)
    return (("xla_backend_optimization_level", 1),)


INIT_OPTIONS = (("xla_backend_optimization_level", 0), ("xla_llvm_disable_expensive_passes", True))
"""What the init program adds on CPU to the chunk program's options (``init_compile_options``)."""


def init_compile_options(chunk_options: tuple, mesh: Mesh) -> tuple:
    """XLA's options for the init program, from the chunk program's (``compile_options``).

    On CPU, LLVM's level 0 without its expensive passes (``INIT_OPTIONS``): the program
    runs once a call (the chains' starts, a step-size search: a few gradients), and its
    compile shares the cores with the chunk program's. Measured (2 CPU devices, the first
    call, cache off): on jax 0.12, the four PyMC models of ``bench_time_to_posterior.py``
    compiled their init program in 0.93-1.25 s against 1.44-2.61 s, the chunk program
    beside it finished 0.1-1.3 s sooner, and a first ``cr.sample`` took 0.4-1.5 s less.
    On jax 0.10 only beside XLA's older fusion emitters, where the chunk has them (eight
    schools' init 1.1 -> 0.7 s): with the newer emitters, level 0 changed a vmapped
    numpyro run's starts in the last bits (``tests/bitwise_runs.py``'s ``numpyro_b_none``),
    and with them its draws; with the older ones, and on jax 0.12 everywhere, the recorded
    runs keep their bits. The options are facts of the call: the same call gives the same
    draws in every process. Accelerators keep their defaults.

    Examples:
        >>> import chainrunner as cr
        >>> level = init_compile_options((("xla_backend_optimization_level", 1),),
        ...                              cr.chain_mesh(1))[0]
        >>> level
        ('xla_backend_optimization_level', 0)
    """
    if mesh.devices.flat[0].platform != "cpu" or (_old_jax() and not chunk_options):
        return chunk_options
    kept = tuple(o for o in chunk_options if o[0] != "xla_backend_optimization_level")
    return (*kept, *INIT_OPTIONS)


def _one(facts: str) -> str:
    return f"auto: 1, chains one after another ({facts})"


def estimate(steps: int, per_device: int, flops: float, old_jax: bool) -> float:
    """Seconds a device samples ``steps`` steps of ``per_device`` chains with ``1``, at the
    rule's rates (a NUTS step's trajectory counted as one expansion: a lower bound)."""
    return steps * per_device * (STEP_OVERHEAD_S[old_jax] + flops / FLOPS_PER_S)


def step_flops(start: Any) -> float | None:
    """Flops of one chain's kernel step (``_jaxpr.flops``), read from the step's trace that
    the run makes anyway (``_programs.kernel_step``, which also gives the draw's shape):
    nothing extra is traced or lowered. ``None`` where the step does not trace (its error
    surfaces at init, with the run's diagnosis)."""
    try:
        stepped = kernel_step(start.kernel, start.position, start.state)
    except Exception:
        return None
    return flops(stepped.jaxpr)
