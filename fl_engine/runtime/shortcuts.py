"""Planned calls without TFF's per-call Python: a round of a small model
costs its TensorFlow and little else.

Once a computation's call has run as a plan (`in_process._Plan`), the same
call with an argument of the same structure runs the same plan; what TFF's
execution context does around it (argument transform and type check,
ingestion into the executor, the executor's walk of the argument and
result, `type_to_py_container` of the result) then gives the same result by
construction, and cost about a third of a planned round of synthetic_lr at
20 clients. A `Shortcut` is recorded from one call that went through TFF's
context: which leaf of the caller's argument feeds which placeholder of the
plan, and how the result's containers are rebuilt around the fetched
values. It is taken only when the argument has exactly the recorded
structure (containers, their keys and lengths: hence the same placed
layout) and every fed leaf is a NumPy value of the placeholder's dtype and
a compatible shape (or a dataset of the recorded element spec); anything
else goes through TFF's context as before, with its checks and errors.
Results are the plan's own, in the containers TFF built the first time, so
equality with the context's path holds by construction;
`tests/fl_engine/runtime/test_in_process.py` checks it over the conformance suite.

Recorded only when every leaf matches by identity: an argument TFF's
context converted (Python numbers, eager tensors) or a result it converted
leaves no shortcut.
"""

import collections
from typing import Any, Callable, Optional

import attr
import numpy as np
import tensorflow as tf

from fl_engine.runtime import in_process
from fl_common.tff_private import structure

SHORTCUTS = True  # False: every call goes through TFF's context.
MISS = object()  # What a `Shortcut` returns for an argument it cannot take.

_LEAF = 'leaf'


def _attrs_names(cls: type) -> Optional[tuple[str, ...]]:
  fields = attr.fields(cls)
  if not all(f.init and f.alias == f.name for f in fields):
    return None  # Not rebuilt from its fields by name.
  return tuple(f.name for f in fields)


def flatten(value: Any, leaves: list[Any]) -> Any:
  """`value`'s leaves appended to `leaves`; returns its structure (a
  hashable description of its containers, comparable between calls)."""
  kind = type(value)
  if kind is np.ndarray or kind in _SCALARS:
    leaves.append(value)
    return _LEAF
  if kind is structure.Struct:
    elements = structure.to_elements(value)
    return (kind, tuple(name for name, _ in elements),
            tuple(flatten(element, leaves) for _, element in elements))
  if kind is list or kind is tuple:
    return (kind, len(value), tuple(flatten(v, leaves) for v in value))
  if kind is dict or kind is collections.OrderedDict:
    return (kind, tuple(value), tuple(flatten(v, leaves)
                                      for v in value.values()))
  if issubclass(kind, tuple) and hasattr(kind, '_fields'):  # namedtuple
    return (kind, kind._fields, tuple(flatten(v, leaves) for v in value))
  if attr.has(kind):
    names = _attrs_names(kind)
    if names is not None:
      return (kind, names, tuple(flatten(getattr(value, n), leaves)
                                 for n in names))
  leaves.append(value)
  return _LEAF


_SCALARS = frozenset(
    np.dtype(t).type for t in
    ('bool', 'int8', 'int16', 'int32', 'int64', 'uint8', 'uint16', 'uint32',
     'uint64', 'float16', 'float32', 'float64', 'complex64', 'complex128'))


def _builder(shape: Any, leaf: Callable[[], Callable[[list[Any]], Any]]
             ) -> Callable[[list[Any]], Any]:
  """A function of the fetched values rebuilding a value of structure
  `shape`; `leaf()` gives the function of each leaf, in `flatten`'s order."""
  if shape is _LEAF:
    return leaf()
  kind, keys, children = shape
  parts = [_builder(child, leaf) for child in children]
  if kind is structure.Struct:
    return lambda v: structure.Struct(list(zip(keys, [p(v) for p in parts])))
  if kind is list:
    return lambda v: [p(v) for p in parts]
  if kind is tuple:
    return lambda v: tuple(p(v) for p in parts)
  if kind is dict or kind is collections.OrderedDict:
    return lambda v: kind(zip(keys, [p(v) for p in parts]))
  if issubclass(kind, tuple):  # namedtuple
    return lambda v: kind._make([p(v) for p in parts])
  return lambda v: kind(**dict(zip(keys, [p(v) for p in parts])))  # attrs


class Shortcut:
  """One recorded planned call (module docstring); call it with the leaves
  of an argument of the recorded structure."""

  def __init__(self, device: in_process.Device, plan: Any,
               fed_from: list[int], specs: list[Any],
               build: Callable[[list[Any]], Any]):
    self._device = device
    self._plan = plan
    self._fed_from = fed_from
    # Per fed leaf: (NumPy dtype, dimensions with None where any size is
    # accepted, or None for any rank) of a tensor, (None, element spec, None)
    # of a dataset.
    self._checks = []
    for (placeholder, kind, dtype), spec in zip(plan.feeds, specs):
      if kind == 'tensor':
        dims = (None if placeholder.shape.rank is None else
                placeholder.shape.as_list())
        self._checks.append((np.dtype(dtype), None, dims))
      else:
        self._checks.append((None, spec, None))
    self._build = build

  def __call__(self, leaves: list[Any]) -> Any:
    fed = [leaves[i] for i in self._fed_from]
    for value, (dtype, spec, dims) in zip(fed, self._checks):
      if dtype is not None:
        if (type(value) is not np.ndarray and type(value) not in _SCALARS
           ) or value.dtype != dtype:
          return MISS
        if dims is not None:
          shape = np.shape(value)
          if len(shape) != len(dims) or any(
              d is not None and d != s for d, s in zip(dims, shape)):
            return MISS
      elif (not isinstance(value, tf.data.Dataset) or
            value.element_spec != spec):
        return MISS
    self._device.calls['planned'] += 1
    self._device.calls['shortcut'] += 1
    return self._build(self._plan.run(fed))


def record(device: in_process.Device, arg_leaves: list[Any],
           calls: list[tuple[Any, list[Any], list[Any]]], result: Any
           ) -> Optional[Shortcut]:
  """The shortcut of a call whose argument's leaves were `arg_leaves`, which
  ran the plan calls `calls` (`in_process.recording_plans`) and returned
  `result`; None if the call cannot be replayed (module docstring)."""
  if len(calls) != 1:
    return None  # Interpreted, or not one plan: nothing to replay.
  plan, feed_leaves, values = calls[0]
  by_id = {}
  for index, leaf in enumerate(arg_leaves):
    by_id.setdefault(id(leaf), index)
  fed_from = [by_id.get(id(leaf)) for leaf in feed_leaves]
  if None in fed_from or len(set(fed_from)) != len(arg_leaves):
    return None  # A leaf converted by TFF's context, or not fed.
  specs = []
  for leaf, (_, kind, _) in zip(feed_leaves, plan.feeds):
    if kind == 'tensor':
      specs.append(None)
    elif isinstance(leaf, tf.data.Dataset):
      specs.append(leaf.element_spec)
    else:
      return None
  value_index = {id(v): i for i, v in enumerate(values)}
  literals = {id(v) for v in plan.literals()}
  result_leaves = []
  shape = flatten(result, result_leaves)
  sources = []
  for leaf in result_leaves:
    if id(leaf) in value_index:
      sources.append(lambda v, i=value_index[id(leaf)]: v[i])
    elif id(leaf) in literals:
      sources.append(lambda v, c=leaf: c)
    else:
      return None  # Converted by TFF's context.
  source = iter(sources)
  return Shortcut(device, plan, fed_from, specs,
                  _builder(shape, lambda: next(source)))
