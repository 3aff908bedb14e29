"""The engine's checkpoint as data: a JSON encoding that names classes but runs no code.

The engine's state is many objects (streams, detectors over numpy arrays, baselines, the
calibration cache, the evaluation join). :func:`dumps` writes them as JSON, walking each
object's attributes; :func:`loads` rebuilds them. Reading never calls anything the data
names: an object is rebuilt as ``cls.__new__(cls)`` with its attributes set one by one, and
only for a class :func:`allowed` accepts (the analyzers' classes and the monitor's state
classes, the same list the checkpoints of earlier versions were read with,
``safe_pickle.py``). So a state file, even one forged with a leaked key, can describe
values, never actions (README "Durability").

The encoding. JSON's ``null``, booleans, numbers and strings stand for themselves (a lone
surrogate is kept, escaped); every other value is a JSON array whose first element says
what it is:

================  ==============================================================
``["l", ...]``    list            ``["t", ...]``   tuple
``["d", k, v, ...]`` dict (keys of any type) ``["od", ...]`` OrderedDict
``["ctr", ...]``  Counter         ``["dd", factory, k, v, ...]`` defaultdict
``["s", ...]``    set             ``["fs", ...]``  frozenset
``["dq", maxlen, ...]`` deque     ``["b", base64]`` bytes ``["ba", base64]`` bytearray
``["c", re, im]`` complex         ``["f", "nan"|"inf"|"-inf"]`` a non-finite float
``["nd", dtype, shape, base64]`` numpy array (C order; no object dtype)
``["ns", dtype, base64]`` numpy scalar ``["dt", dtype]`` numpy dtype
``["gen", bit generator, state]`` numpy Generator
``["e", "module:Class", value]`` enum member
``["o", "module:Class", name, value, ...]`` an object of an allowed class
``["fn", "module:function"]`` an allowed function (a default factory)
``["r", n]``      the n-th shared value already read (0-based)
================  ==============================================================

Shared values (objects, lists, dicts, sets, deques, arrays, generators) are numbered in
the order they are first written and read back as one object wherever they recur, so
references between detectors and cycles survive as they are. A dataclass read from an
older checkpoint gets its newer fields' defaults; :class:`StreamState`'s own
``__setstate__`` is honoured.
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import functools
import importlib
import json
import math
import types
from collections import Counter, OrderedDict, defaultdict, deque
from typing import Any

import numpy as np

from assaywatch.monitor.service.safe_pickle import allowed

__all__ = ["StateDecodeError", "dumps", "loads"]

#: Factories a defaultdict of the state may have (named in the data).
FACTORIES: dict[str, Any] = {"list": list, "dict": dict, "set": set, "int": int,
                             "float": float, "Counter": Counter}
#: Bit generators a Generator of the state may use.
BIT_GENERATORS = frozenset({"PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64"})
_SHARED = (list, dict, set, deque, OrderedDict, Counter, defaultdict, np.ndarray,
           np.random.Generator)


class StateDecodeError(ValueError):
    """The data is not a state this version can read (malformed, or naming a class or
    function outside the allow-list)."""


def _class_ref(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _allowed_class(ref: str) -> type:
    module, _, name = ref.partition(":")
    if not module or not name or not allowed(module, name):
        raise StateDecodeError(f"the state names {ref}, which a checkpoint never holds: "
                               "refused")
    cls = getattr(importlib.import_module(module), name)
    if not isinstance(cls, type):
        raise StateDecodeError(f"{ref} is not a class")
    return cls


def _factory_name(f: Any) -> str:
    for name, g in FACTORIES.items():
        if f is g:
            return name
    if f is not None:
        ref = f"{getattr(f, '__module__', '')}:{getattr(f, '__qualname__', '')}"
        module, _, name = ref.partition(":")
        if allowed(module, name):
            return ref
        raise TypeError(f"state codec: a defaultdict with factory {ref} (not allowed)")
    return ""


def _ordered(items: set[Any] | frozenset[Any]) -> list[Any]:
    """A set's items sorted when they compare (the same state gives the same bytes,
    whatever order the set iterates in), else as they come."""
    try:
        return sorted(items)
    except TypeError:
        return list(items)


@functools.cache
def _slot_names(cls: type) -> tuple[str, ...]:
    out: list[str] = []
    for c in cls.__mro__:
        slots = c.__dict__.get("__slots__", ())
        for s in (slots,) if isinstance(slots, str) else slots:
            if s not in ("__dict__", "__weakref__") and s not in out:
                out.append(s)
    return tuple(out)


@functools.cache
def _state_class(cls: type) -> str:
    """``module:Class`` of a class whose objects the state may hold; TypeError else."""
    ref = _class_ref(cls)
    module, _, name = ref.partition(":")
    if not allowed(module, name):
        raise TypeError(f"state codec: {ref} is not a state class (safe_pickle.allowed)")
    return ref


class _Encoder:
    def __init__(self) -> None:
        self.memo: dict[int, int] = {}
        self.keep: list[Any] = []  # ids stay valid while encoding

    def shared(self, obj: Any) -> list[Any] | None:
        n = self.memo.get(id(obj))
        if n is not None:
            return ["r", n]
        self.memo[id(obj)] = len(self.keep)
        self.keep.append(obj)
        return None

    def pairs(self, tag: str, d: Any, *head: Any) -> list[Any]:
        out: list[Any] = [tag, *head]
        enc = self.enc
        for k, v in d.items():
            out.append(enc(k))
            out.append(enc(v))
        return out

    def enc(self, x: Any) -> Any:
        t = type(x)
        if t is str or t is int or t is bool or x is None:
            return x
        if t is float:
            return x if math.isfinite(x) else ["f", repr(x)]
        if t is tuple:
            return ["t", *map(self.enc, x)]
        if t is frozenset:
            return ["fs", *map(self.enc, _ordered(x))]
        if t is bytes:
            return ["b", base64.b64encode(x).decode("ascii")]
        if t is complex:
            return ["c", self.enc(x.real), self.enc(x.imag)]
        if isinstance(x, enum.Enum):
            return ["e", _class_ref(t), self.enc(x.value)]
        if isinstance(x, np.generic):
            if x.dtype.hasobject:
                raise TypeError("state codec: a numpy object scalar")
            return ["ns", x.dtype.str, base64.b64encode(x.tobytes()).decode("ascii")]
        if t is np.dtype or isinstance(x, np.dtype):
            return ["dt", x.str]
        if t is types.FunctionType:
            fref = f"{x.__module__}:{x.__qualname__}"
            module, _, name = fref.partition(":")
            if not allowed(module, name):
                raise TypeError(f"state codec: function {fref} is not allowed")
            return ["fn", fref]
        ref = self.shared(x)
        if ref is not None:
            return ref
        if t is list:
            return ["l", *map(self.enc, x)]
        if t is dict:
            return self.pairs("d", x)
        if t is set:
            return ["s", *map(self.enc, _ordered(x))]
        if t is OrderedDict:
            return self.pairs("od", x)
        if t is Counter:
            return self.pairs("ctr", x)
        if t is defaultdict:
            return self.pairs("dd", x, _factory_name(x.default_factory))
        if t is deque:
            return ["dq", x.maxlen, *map(self.enc, x)]
        if t is bytearray:
            return ["ba", base64.b64encode(bytes(x)).decode("ascii")]
        if t is np.ndarray:
            if x.dtype.hasobject:
                raise TypeError("state codec: a numpy array of Python objects")
            return ["nd", x.dtype.str, list(x.shape),
                    base64.b64encode(np.ascontiguousarray(x).tobytes()).decode("ascii")]
        if t is np.random.Generator:
            bg = x.bit_generator
            return ["gen", type(bg).__name__, self.enc(bg.state)]
        return self.obj(x, t)

    def obj(self, x: Any, t: type) -> list[Any]:
        out: list[Any] = ["o", _state_class(t)]
        d = getattr(x, "__dict__", None)
        attrs = list(d.items()) if d is not None else []
        for s in _slot_names(t):
            try:
                attrs.append((s, object.__getattribute__(x, s)))
            except AttributeError:
                continue
        for k, v in attrs:
            out.append(k)
            try:
                out.append(self.enc(v))
            except TypeError as exc:  # say where: Class.attribute.attribute...
                raise TypeError(f"{t.__name__}.{k}: {exc}") from None
        return out


def dumps(obj: Any) -> bytes:
    """``obj`` as JSON bytes (ASCII); :class:`TypeError` for a value the state never
    holds (an object of a class outside the allow-list, a function, a file)."""
    return json.dumps(_Encoder().enc(obj), separators=(",", ":"),
                      ensure_ascii=True, allow_nan=False).encode("ascii")


class _Decoder:
    def __init__(self) -> None:
        self.shared: list[Any] = []

    def new(self, obj: Any) -> Any:
        self.shared.append(obj)
        return obj

    def fill_pairs(self, target: Any, items: list[Any]) -> Any:
        if len(items) % 2:
            raise StateDecodeError("a mapping with an odd number of items")
        dec = self.dec
        for i in range(0, len(items), 2):
            k = dec(items[i])  # the key first: shared values are numbered in that order
            target[k] = dec(items[i + 1])
        return target

    def dec(self, x: Any) -> Any:  # noqa: C901 - one branch per tag
        if not isinstance(x, list):
            if isinstance(x, dict):
                raise StateDecodeError("a JSON object where the encoding has none")
            return x
        if not x or not isinstance(x[0], str):
            raise StateDecodeError("an array without a tag")
        tag, rest = x[0], x[1:]
        dec = self.dec
        if tag == "l":
            out: list[Any] = self.new([])
            out.extend(map(dec, rest))
            return out
        if tag == "t":
            return tuple(map(dec, rest))
        if tag == "d":
            return self.fill_pairs(self.new({}), rest)
        if tag == "od":
            return self.fill_pairs(self.new(OrderedDict()), rest)
        if tag == "ctr":
            return self.fill_pairs(self.new(Counter()), rest)
        if tag == "dd":
            fname = rest[0] if rest else None
            if not isinstance(fname, str):
                raise StateDecodeError("a defaultdict without its factory")
            return self.fill_pairs(self.new(defaultdict(self.factory(fname))), rest[1:])
        if tag == "s":
            s: set[Any] = self.new(set())
            s.update(map(dec, rest))
            return s
        if tag == "fs":
            return frozenset(map(dec, rest))
        if tag == "dq":
            if not rest or not (rest[0] is None or isinstance(rest[0], int)):
                raise StateDecodeError("a deque without its maxlen")
            q: deque[Any] = self.new(deque(maxlen=rest[0]))
            q.extend(map(dec, rest[1:]))
            return q
        if tag == "f":
            if rest not in (["nan"], ["inf"], ["-inf"]):
                raise StateDecodeError(f"not a float: {rest!r}")
            return float(rest[0])
        if tag == "c":
            return complex(float(rest[0]), float(rest[1]))
        if tag == "b":
            return base64.b64decode(self.text(rest), validate=True)
        if tag == "ba":
            return self.new(bytearray(base64.b64decode(self.text(rest), validate=True)))
        if tag == "nd":
            dtype, shape, data = rest
            dt = self.dtype(dtype)
            if not isinstance(shape, list) or not all(isinstance(n, int) and n >= 0
                                                      for n in shape):
                raise StateDecodeError(f"not an array shape: {shape!r}")
            raw = base64.b64decode(data, validate=True)
            arr = np.frombuffer(raw, dtype=dt).reshape(shape).copy()
            return self.new(arr)
        if tag == "ns":
            dt = self.dtype(rest[0])
            return np.frombuffer(base64.b64decode(rest[1], validate=True), dtype=dt)[0]
        if tag == "dt":
            return self.dtype(rest[0])
        if tag == "gen":
            name, state = rest
            if name not in BIT_GENERATORS:
                raise StateDecodeError(f"bit generator {name!r} is not one numpy has")
            gen = self.new(np.random.Generator(getattr(np.random, name)()))
            gen.bit_generator.state = dec(state)
            return gen
        if tag == "e":
            cls = _allowed_class(self.text(rest[:1]))
            if not issubclass(cls, enum.Enum):
                raise StateDecodeError(f"{rest[0]} is not an enum")
            return cls(dec(rest[1]))
        if tag == "o":
            return self.obj(rest)
        if tag == "fn":
            ref = self.text(rest)
            module, _, name = ref.partition(":")
            if not allowed(module, name) or isinstance(
                    f := getattr(importlib.import_module(module), name), type):
                raise StateDecodeError(f"the state names function {ref}: refused")
            return f
        if tag == "r":
            n = rest[0] if rest else None
            if not isinstance(n, int) or not 0 <= n < len(self.shared):
                raise StateDecodeError(f"a reference to value {n!r}, not read before")
            return self.shared[n]
        raise StateDecodeError(f"unknown tag {tag!r}")

    @staticmethod
    def text(rest: list[Any]) -> str:
        if len(rest) < 1 or not isinstance(rest[0], str):
            raise StateDecodeError("a string expected")
        return rest[0]

    @staticmethod
    def dtype(s: Any) -> np.dtype[Any]:
        if not isinstance(s, str):
            raise StateDecodeError(f"not a dtype: {s!r}")
        try:
            dt = np.dtype(s)
        except TypeError:
            raise StateDecodeError(f"not a dtype: {s!r}") from None
        if dt.hasobject:
            raise StateDecodeError("a numpy dtype of Python objects")
        return dt

    @staticmethod
    def factory(name: str) -> Any:
        if name == "":
            return None
        if name in FACTORIES:
            return FACTORIES[name]
        module, _, attr = name.partition(":")
        if not allowed(module, attr):
            raise StateDecodeError(f"defaultdict factory {name} is not allowed")
        return getattr(importlib.import_module(module), attr)

    def obj(self, rest: list[Any]) -> Any:
        cls = _allowed_class(self.text(rest[:1]))
        if issubclass(cls, enum.Enum):
            raise StateDecodeError(f"{rest[0]} is an enum, written as an object")
        obj = self.new(cls.__new__(cls))
        items = rest[1:]
        if len(items) % 2:
            raise StateDecodeError(f"{rest[0]}: an odd number of attribute items")
        state: dict[str, Any] = {}
        for i in range(0, len(items), 2):
            name = items[i]
            if not isinstance(name, str) or name.startswith("__"):
                raise StateDecodeError(f"{rest[0]}: attribute name {name!r} refused")
            state[name] = self.dec(items[i + 1])
        setstate = _own_setstate(cls)
        if setstate is not None:
            setstate(obj, state)
            return obj
        if dataclasses.is_dataclass(cls):
            for f in dataclasses.fields(cls):
                if f.name not in state:  # a field newer than the checkpoint
                    if f.default_factory is not dataclasses.MISSING:
                        state[f.name] = f.default_factory()
                    elif f.default is not dataclasses.MISSING:
                        state[f.name] = f.default
        for name, value in state.items():
            object.__setattr__(obj, name, value)
        return obj


def _own_setstate(cls: type) -> Any:
    """A ``__setstate__`` written in an allowed class (StreamState's fills new fields'
    defaults); not the ones dataclasses generate or object's."""
    for c in cls.__mro__:
        f = c.__dict__.get("__setstate__")
        if f is None:
            continue
        if c is object or "_dataclass_" in getattr(f, "__qualname__", "_dataclass_"):
            return None
        return f
    return None


def loads(data: bytes) -> Any:
    """The value :func:`dumps` wrote; :class:`StateDecodeError` for anything else."""
    try:
        tree = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise StateDecodeError(f"not JSON ({type(exc).__name__})") from None
    try:
        return _Decoder().dec(tree)
    except StateDecodeError:
        raise
    except (ValueError, TypeError, KeyError, IndexError, AttributeError,
            RecursionError) as exc:
        raise StateDecodeError(f"malformed state ({type(exc).__name__}: {exc})") from None
