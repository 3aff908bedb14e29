"""Behavioural fingerprints: the paper's Algorithm 3 (SPEC.md 7.1) as a fixed vector.

A fingerprint maps one :class:`~assaywatch.analyzers.model.Run` to a float64 vector made of
a **fixed, documented part** (14 dimensions, identical for every stream so that streams
compare) followed by **per-tool usage fractions** over the stream's tool inventory (so a
change from tool A to tool B with the same step counts stays visible, which it is not on
the released implementation of the paper).

The fixed part, in this order (``FIXED_FEATURES``):

====  =====================  ==========================================================
 idx  name                   definition (L = number of steps)
====  =====================  ==========================================================
  0   ``steps``              log1p(L)
  1   ``max_depth``          D = max ``Step.depth`` (0 for an empty run)
  2   ``branches``           B = number of distinct (action, tool) pairs
  3   ``output_length``      log1p(``Run.output_length``)
  4   ``output_complexity``  kappa in [0, 1], see below
  5   ``frac_llm``           share of steps with action ``llm``
  6   ``frac_tool``          share of ``tool`` steps (every tool, listed or not)
  7   ``frac_retrieve``      share of ``retrieve`` steps
  8   ``frac_delegate``      share of ``handoff`` and ``agent`` steps
  9   ``any_error``          e = 1 when the root or any step reported an error, else 0
 10   ``recovery_rate``      rho = recovered errors / error steps (0 without errors)
 11   ``total_tokens``       log1p(C), C = sum of input + output tokens
 12   ``mean_step_tokens``   log1p(C / L) (0 for an empty run)
 13   ``duration``           log1p(run duration in seconds)
====  =====================  ==========================================================

followed by ``tool:<name>`` = calls of tool *name* / L for each tool of the inventory.

Choices and why
---------------
* The share of ``other`` steps is ``1 - (frac_llm + frac_tool + frac_retrieve +
  frac_delegate)``; it is dropped because it is an exact linear combination of the four
  kept shares (a collinear column only costs a degree of freedom).
* ``output_complexity``: the paper uses a readability grade of the final output, but no
  content ever enters the model (DESIGN.md). The substitute is the share of the run's
  output tokens produced by its **last** ``llm`` step -- near 1 when the answer is one
  long final generation, small when the run spreads its generation over many
  intermediate steps. It lies in [0, 1] like the paper's kappa and is 0 when the run has
  no ``llm`` step or no output tokens.
* Recovery: an error step counts as recovered when a *later* step with the same
  (action, tool) succeeds (a retry that worked). Errors on the root span alone set
  ``any_error`` but do not enter rho (there is no step to recover).
* Counts, tokens, lengths and durations are heavy-tailed; log1p makes them roughly
  symmetric, keeps 0 at 0, and turns multiplicative changes (latency x1.5) into shifts,
  which is what the Gaussian tests downstream (Hotelling T^2, CUSUM) assume. A difference
  of 1 on a log1p feature is a factor of about e, and its standard deviation is close to
  the coefficient of variation of the raw quantity.
* Efficiency uses tokens rather than money: ``cost_usd`` is rarely reported on spans,
  tokens almost always are; latency enters through ``duration``.
* A tool called but absent from the inventory gets no column (columns must line up with
  the baseline) but still counts in ``frac_tool`` and ``branches``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
from numpy.typing import NDArray

from assaywatch.analyzers.model import Action, Run

#: The 14 fixed fingerprint dimensions, in vector order.
FIXED_FEATURES: tuple[str, ...] = (
    "steps",
    "max_depth",
    "branches",
    "output_length",
    "output_complexity",
    "frac_llm",
    "frac_tool",
    "frac_retrieve",
    "frac_delegate",
    "any_error",
    "recovery_rate",
    "total_tokens",
    "mean_step_tokens",
    "duration",
)

#: Prefix of the per-tool usage columns.
TOOL_PREFIX = "tool:"

N_FIXED = len(FIXED_FEATURES)


def feature_names(tools: Sequence[str]) -> list[str]:
    """Names of the fingerprint columns for a stream with tool inventory ``tools``.

    Parameters
    ----------
    tools:
        The stream's tool inventory, in column order (baselines keep it sorted).

    Returns
    -------
    list of str
        ``FIXED_FEATURES`` followed by ``"tool:<name>"`` for each tool.
    """
    _check_tools(tools)
    return [*FIXED_FEATURES, *(TOOL_PREFIX + t for t in tools)]


def _check_tools(tools: Sequence[str]) -> None:
    if isinstance(tools, str):
        raise ValueError(
            f"tools must be a sequence of tool names, got the string {tools!r}; "
            "wrap a single tool in a list"
        )
    if len(set(tools)) != len(tools):
        dup = sorted({t for t in tools if list(tools).count(t) > 1})
        raise ValueError(f"tool inventory has duplicate names {dup}; list each tool once")


def _fill(run: Run, out: NDArray[np.float64], tool_index: dict[str, int]) -> None:
    """Write the fingerprint of ``run`` into the zeroed row ``out`` (see module doc)."""
    steps = run.steps
    n = len(steps)
    # The root's error counts even for a run without steps.
    any_error = run.error
    if n == 0:
        out[3] = np.log1p(max(0, run.output_length))
        out[13] = np.log1p(run.duration_s)
        out[9] = 1.0 if any_error else 0.0
        return

    n_llm = n_tool = n_retrieve = n_delegate = 0
    max_depth = 0
    pairs: set[tuple[Action, str | None]] = set()
    tool_calls: dict[int, int] = {}
    tokens = 0
    out_tokens = 0
    last_llm_out = 0
    for s in steps:
        a = s.action
        pairs.add((a, s.tool))
        if s.depth > max_depth:
            max_depth = s.depth
        tokens += s.input_tokens + s.output_tokens
        out_tokens += s.output_tokens
        if a is Action.LLM:
            n_llm += 1
            last_llm_out = s.output_tokens
        elif a is Action.TOOL:
            n_tool += 1
            if s.tool is not None:
                j = tool_index.get(s.tool)
                if j is not None:
                    tool_calls[j] = tool_calls.get(j, 0) + 1
        elif a is Action.RETRIEVE:
            n_retrieve += 1
        elif a is Action.HANDOFF or a is Action.AGENT:
            n_delegate += 1
        if s.error:
            any_error = True

    # Recovery: walk backwards remembering which (action, tool) later succeeded.
    n_err = n_rec = 0
    succeeded_later: set[tuple[Action, str | None]] = set()
    for s in reversed(steps):
        k = (s.action, s.tool)
        if s.error:
            n_err += 1
            if k in succeeded_later:
                n_rec += 1
        else:
            succeeded_later.add(k)

    # One vectorised log1p for the five log features (numpy's array and scalar log1p agree
    # bit for bit; five scalar ufunc calls cost more than the rest of the row).
    logs = np.log1p(np.array([n, max(0, run.output_length), tokens, tokens / n,
                              run.duration_s], dtype=np.float64))
    out[0] = logs[0]
    out[3] = logs[1]
    out[13] = logs[4]
    out[1] = max_depth
    out[2] = len(pairs)
    out[4] = last_llm_out / out_tokens if out_tokens > 0 else 0.0
    out[5] = n_llm / n
    out[6] = n_tool / n
    out[7] = n_retrieve / n
    out[8] = n_delegate / n
    out[9] = 1.0 if any_error else 0.0
    out[10] = n_rec / n_err if n_err else 0.0
    out[11] = logs[2]
    out[12] = logs[3]
    for j, c in tool_calls.items():
        out[N_FIXED + j] = c / n


def fingerprint(run: Run, tools: Sequence[str]) -> NDArray[np.float64]:
    """The fingerprint vector of one run.

    Parameters
    ----------
    run:
        The run.
    tools:
        The stream's tool inventory (column order of the ``tool:`` features).

    Returns
    -------
    numpy.ndarray
        float64 vector of length ``14 + len(tools)``, laid out as ``feature_names(tools)``.

    Examples
    --------
    >>> from assaywatch.analyzers.model import Run, Step, StreamKey, Action
    >>> r = Run("t", "s", StreamKey("a"), steps=[Step(Action.LLM, output_tokens=10),
    ...     Step(Action.TOOL, tool="search"), Step(Action.LLM, output_tokens=30)])
    >>> f = fingerprint(r, ["calc", "search"])
    >>> float(f[4]), float(f[14]), round(float(f[15]), 3)
    (0.75, 0.0, 0.333)
    """
    _check_tools(tools)
    out = np.zeros(N_FIXED + len(tools), dtype=np.float64)
    _fill(run, out, {t: i for i, t in enumerate(tools)})
    return out


def fingerprint_matrix(runs: Iterable[Run], tools: Sequence[str]) -> NDArray[np.float64]:
    """Fingerprints of many runs as an ``(n, 14 + len(tools))`` float64 matrix."""
    _check_tools(tools)
    index = {t: i for i, t in enumerate(tools)}
    run_list = list(runs)
    out = np.zeros((len(run_list), N_FIXED + len(tools)), dtype=np.float64)
    for i, run in enumerate(run_list):
        _fill(run, out[i], index)
    return out
