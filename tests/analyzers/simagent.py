"""A seeded simulated tool-using agent that produces :class:`Run` objects.

Reusable by every test and benchmark that needs realistic runs::

    from tests.analyzers.simagent import simulate_runs
    runs = simulate_runs(200, np.random.default_rng(7), pass_rate=0.8)

Import it by its full name (``tests.analyzers.simagent``); pytest is started with
``python -m pytest`` from the repository root, which puts the root on ``sys.path``.

Shape of one run: an ``llm`` step (planning), then ``m ~ Poisson(tool_calls_mean)`` rounds
of ``tool`` call + ``llm`` step, then ``extra_steps`` further ``llm`` steps (a reflection
step; ``extra_steps=1`` is a "step count +1" regression). Each tool call fails with
probability ``error_rate``; a failed call is retried once (same tool, succeeds) with
probability ``recovery_prob``. Token counts and latencies are log-normal (realistically
skewed); ``token_scale`` and ``latency_scale`` multiply them. The outcome is an
independent Bernoulli(``pass_rate``) -- fingerprint tests need no oracle.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from assaywatch.analyzers.model import Action, Outcome, Run, Step, StreamKey

DEFAULT_TOOLS: Mapping[str, float] = {"search": 0.5, "lookup": 0.3, "calc": 0.2}
DEFAULT_KEY = StreamKey("support-agent", "1.0", "refund")


def simulate_run(
    rng: np.random.Generator,
    *,
    pass_rate: float = 0.9,
    tool_weights: Mapping[str, float] = DEFAULT_TOOLS,
    tool_calls_mean: float = 2.0,
    extra_steps: int = 0,
    token_scale: float = 1.0,
    latency_scale: float = 1.0,
    output_length_mean: float = 400.0,
    error_rate: float = 0.05,
    recovery_prob: float = 0.7,
    model: str = "gpt-sim-1",
    key: StreamKey = DEFAULT_KEY,
    start_ns: int = 1_700_000_000_000_000_000,
) -> Run:
    """One simulated run (see the module docstring for its shape).

    Trace and span ids are drawn from ``rng`` (lowercase hex, 32 and 16 digits), so runs of
    different calls never collide and the same seed reproduces them.
    """
    names: Sequence[str] = list(tool_weights)
    w = np.array([tool_weights[t] for t in names], dtype=float)
    if len(names) and ((w < 0).any() or w.sum() <= 0):
        raise ValueError(f"tool_weights must be non-negative with a positive sum: {tool_weights}")
    p = w / w.sum() if names else w
    steps: list[Step] = []
    t = start_ns
    # Random W3C-style ids: unique across calls, reproducible for a seed.
    trace_id = rng.bytes(16).hex()
    root_id = rng.bytes(8).hex()

    def add(action: Action, tool: str | None = None, *, error: bool = False) -> None:
        nonlocal t
        if action is Action.LLM:
            inp = int(rng.lognormal(np.log(600.0 * token_scale), 0.3))
            outp = int(rng.lognormal(np.log(120.0 * token_scale), 0.4))
            lat = float(rng.lognormal(np.log(0.8 * latency_scale), 0.35))
            out_len = outp * 4
        else:
            inp = outp = 0
            lat = float(rng.lognormal(np.log(0.25 * latency_scale), 0.5))
            out_len = int(rng.lognormal(np.log(300.0), 0.6))
        sid = rng.bytes(8).hex()
        steps.append(
            Step(
                action=action,
                tool=tool,
                output_length=out_len,
                error=error,
                input_tokens=inp,
                output_tokens=outp,
                latency_s=lat,
                depth=1,
                start_ns=t,
                span_id=sid,
                parent_span_id=root_id,
                name=f"{action.value} {tool or ''}".strip(),
                model=model if action is Action.LLM else None,
            )
        )
        t += int(lat * 1e9) + 1_000_000

    add(Action.LLM)
    m = int(rng.poisson(tool_calls_mean)) if names else 0
    for _ in range(m):
        tool = str(names[int(rng.choice(len(names), p=p))])
        if rng.random() < error_rate:
            add(Action.TOOL, tool, error=True)
            if rng.random() < recovery_prob:
                add(Action.TOOL, tool)
        else:
            add(Action.TOOL, tool)
        add(Action.LLM)
    for _ in range(extra_steps):
        add(Action.LLM)
    outcome = Outcome.PASS if rng.random() < pass_rate else Outcome.FAIL
    return Run(
        trace_id=trace_id,
        root_span_id=root_id,
        key=key,
        steps=steps,
        output_length=int(rng.lognormal(np.log(output_length_mean), 0.5)),
        outcome=outcome,
        models=(model,),
        start_ns=start_ns,
        end_ns=t + 2_000_000,
    )


def simulate_runs(
    n: int,
    rng: np.random.Generator,
    *,
    pass_rate: float = 0.9,
    tool_weights: Mapping[str, float] = DEFAULT_TOOLS,
    tool_calls_mean: float = 2.0,
    extra_steps: int = 0,
    token_scale: float = 1.0,
    latency_scale: float = 1.0,
    output_length_mean: float = 400.0,
    error_rate: float = 0.05,
    recovery_prob: float = 0.7,
    model: str = "gpt-sim-1",
    key: StreamKey = DEFAULT_KEY,
    start_ns: int = 1_700_000_000_000_000_000,
    interval_s: float = 30.0,
) -> list[Run]:
    """``n`` independent simulated runs, started ``interval_s`` apart.

    Parameters
    ----------
    n:
        Number of runs.
    rng:
        A seeded ``numpy.random.Generator``; the same seed gives the same runs.
    pass_rate:
        Probability that a run's outcome is ``pass``.
    tool_weights:
        Relative frequency of each tool per call (normalised); an empty mapping gives
        runs with a single ``llm`` step (plus ``extra_steps``).
    tool_calls_mean:
        Poisson mean of the number of tool calls per run.
    extra_steps:
        Fixed number of extra ``llm`` steps appended to every run.
    token_scale, latency_scale:
        Multipliers of the log-normal token counts and latencies.
    output_length_mean:
        Median final output length (characters), log-normal with sigma 0.5.
    error_rate, recovery_prob:
        Probability that a tool call fails, and that a failure is retried successfully.
    model, key:
        The model name recorded on ``llm`` steps and the stream key of every run.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    return [
        simulate_run(
            rng,
            pass_rate=pass_rate,
            tool_weights=tool_weights,
            tool_calls_mean=tool_calls_mean,
            extra_steps=extra_steps,
            token_scale=token_scale,
            latency_scale=latency_scale,
            output_length_mean=output_length_mean,
            error_rate=error_rate,
            recovery_prob=recovery_prob,
            model=model,
            key=key,
            start_ns=start_ns + int(i * interval_s * 1e9),
        )
        for i in range(n)
    ]
