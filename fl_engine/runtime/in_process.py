"""TFF computations run in this process's own TensorFlow, on its devices.

TFF 0.87 executes a federated computation only in its C++ `worker_binary`
(a statically linked TensorFlow 2.14, CPU only, reached over gRPC). This
module is the in-process counterpart: `InProcessExecutor` is a TFF
`Executor` that evaluates the computation TFF's native compiler produces
(`compiler.desugar_and_transform_to_native`, as for the worker) in Python,
walking its `pb.Computation` as the worker does (turning it into building
blocks first cost ~0.3 s per computation), and runs each of its TensorFlow
computations in a `tf.compat.v1.Session` of this process, imported as
TFF's `tensorflow_utils.deserialize_and_call_tf_computation` imports one
and placed on one device. Values between computations are NumPy arrays (and `tf.data`
datasets); a CLIENTS-placed value is a list with one member per client.

What the compiled computations contain is small: building blocks
(references, lambdas, blocks, calls, structs, selections, literals) and the
intrinsics `federated_{apply,map,aggregate,broadcast,eval_at_server,
value_at_server,value_at_clients,zip_at_server,zip_at_clients}` (plus the
few others below). Each is given the C++ federating executor's meaning:
`federated_aggregate` folds `accumulate` over the clients in their order,
then `report`; `federated_map` calls its function once per client, on up to
`lanes` threads at once. An intrinsic not implemented here is refused with
its name, never approximated.

From a computation's second call with the same layout of its argument,
the call runs as a `_Plan`: the same walk, with each TensorFlow computation
imported into one graph instead of run, then one session call per round
(see "Plans" below, and `docs/runtime.md`).

Why one module: the executor, its values, the TensorFlow computations'
graphs and sessions, the plans and the devices they run on are one
mechanism, each part made for the others (the evaluator calls the device's
graphs or builds a plan, the graphs' sessions take the device's configs);
split, every part would import every other.

Each TensorFlow computation's graph is imported once per device; calls take
a session from a pool (one per concurrent call: a session's variables are
its own, so concurrent calls never share them). Sessions of a mapped
function (client work) each use `threads_per_lane` threads; the others
(server update, merges) use every core of the device.
"""

import collections
import concurrent.futures
import contextlib
import os
import queue
import threading
import weakref
from collections.abc import Sequence
from typing import Any, Callable, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from fl_common.tff_private import structure
from fl_common.tff_private import computation_pb2 as pb
from fl_common.tff_private import array
from fl_common.tff_private import intrinsic_defs
from fl_common.tff_private import compiler
from fl_common.tff_private import tensorflow_computation
from fl_common.tff_private import python_executor_stacks
from fl_common.tff_private import executor_base
from fl_common.tff_private import executor_factory as executor_factory_lib
from fl_common.tff_private import executor_value_base
from fl_common.tff_private import placements
from fl_common.tff_private import type_serialization
from tensorflow.python.eager import context as tf_context
from fl_common.tff_private import tensorflow_utils
from fl_common.tff_private import graph_utils
from fl_common.tff_private import serialization_utils

from fl_engine import value_transfer


class UnsupportedComputationError(NotImplementedError):
  """A compiled computation uses something the in-process runtime lacks."""


class _Federated:
  """A placed value: `members` has one entry per client (one if all equal)."""

  __slots__ = ('placement', 'all_equal', 'members')

  def __init__(self, placement, all_equal: bool, members: list[Any]):
    self.placement = placement
    self.all_equal = all_equal
    self.members = members

  def member(self, k: int) -> Any:
    return self.members[0] if self.all_equal else self.members[k]


class _Closure:
  """A lambda (its `pb.Computation`) with the environment it was evaluated
  in."""

  __slots__ = ('block', 'env')

  def __init__(self, block: pb.Computation, env: dict[str, Any]):
    self.block = block
    self.env = env


class _Intrinsic:
  __slots__ = ('uri',)

  def __init__(self, uri: str):
    self.uri = uri


class _TensorFlowFunction:
  __slots__ = ('proto',)

  def __init__(self, proto: pb.Computation):
    self.proto = proto


def _serialize_value(value: Any, kind: str, dtype: Any) -> np.ndarray:
  """A parameter's value as the array its placeholder is fed."""
  if kind == 'tensor':
    return np.asarray(value, dtype)
  # As sent to the worker, prepared ahead when the training loop could
  # (`round_inputs`): the dataset's graph, tf.data's static rewrites off.
  return np.asarray(value_transfer.serialized_graph_def(value), dtype=object)


class _TensorFlowComputation:
  """One TensorFlow computation's graph, placed on `device`.

  The computation's GraphDef is imported as TFF's
  `tensorflow_utils.deserialize_and_call_tf_computation` does (the same
  bindings, init op and session token), but with placeholders fed at each
  call, and without its check of each result tensor's inferred shape against
  the TFF type: TensorFlow 2.21 infers some shapes less precisely than the
  TensorFlow that traced the graph, which the worker never checks either.
  """

  def __init__(self, proto, device: str,
               session_config: tf.compat.v1.ConfigProto,
               placement: Optional['Placement'] = None):
    function_type = type_serialization.deserialize_type(proto.type)
    tensorflow = proto.tensorflow
    self._graph = tf.Graph()
    self._feeds = []  # (placeholder, kind, dtype) in parameter order.
    input_map = {}
    with self._graph.as_default(), tf.device(device):
      if function_type.parameter is not None:
        self._stamp(function_type.parameter, tensorflow.parameter, input_map)
      output_map, self._init_op = _import(
          tensorflow, serialization_utils.unpack_graph_def(
              tensorflow.graph_def), input_map, 'imported')
    self._fetches = []

    def fetch(tensor_name):  # The result holds each tensor's index.
      self._fetches.append(output_map[tensor_name])
      return _Out(len(self._fetches) - 1)

    self._result = _assemble(function_type.result, tensorflow.result, fetch)
    self._graph.finalize()
    self._sessions = _SessionPool(lambda: _Session(
        self._graph, session_config, self._init_op,
        [placeholder for placeholder, _, _ in self._feeds], self._fetches))
    self._placement = placement

  def _stamp(self, type_spec, binding, input_map) -> None:
    kind = binding.WhichOneof('binding')
    if isinstance(type_spec, tff.StructType) and kind == 'struct':
      for (_, element_type), element_binding in zip(
          structure.iter_elements(type_spec), binding.struct.element):
        self._stamp(element_type, element_binding, input_map)
    elif isinstance(type_spec, tff.TensorType) and kind == 'tensor':
      dtype = tf.dtypes.as_dtype(type_spec.dtype)
      placeholder = tf.compat.v1.placeholder(dtype, shape=type_spec.shape)
      self._feeds.append((placeholder, 'tensor', dtype.as_numpy_dtype))
      input_map[binding.tensor.tensor_name] = placeholder
    elif isinstance(type_spec, tff.SequenceType) and kind == 'sequence':
      with tf.device('/device:CPU:0'):
        graph_def = tf.compat.v1.placeholder(tf.string, shape=[])
        self._feeds.append((graph_def, 'sequence', None))
        sequence = binding.sequence
        if sequence.WhichOneof('binding') == 'graph_def_tensor_name':
          input_map[sequence.graph_def_tensor_name] = graph_def
        else:
          input_map[sequence.variant_tensor_name] = (
              tf.raw_ops.DatasetFromGraph(graph_def=graph_def))
    else:
      raise UnsupportedComputationError(
          f'a TensorFlow parameter of type {type_spec} bound as {kind}')

  def __call__(self, arg: Any) -> Any:
    feeds = []
    if self._feeds:
      leaves = []
      _flatten_leaves(arg, leaves)
      if len(leaves) != len(self._feeds):
        raise TypeError(f'{len(leaves)} values for {len(self._feeds)} '
                        'parameters of a TensorFlow computation.')
      feeds = [_serialize_value(leaf, kind, dtype)
               for (_, kind, dtype), leaf in zip(self._feeds, leaves)]
    values = self._sessions.run(
        feeds, self._placement,
        None if self._placement is None else self._placement.add)
    return _filled(self._result, values)

  def close(self) -> None:
    self._sessions.close()


def _import(tensorflow: pb.TensorFlow, graph_def: tf.compat.v1.GraphDef,
            input_map: dict[str, Any], name: str,
            token: Optional[tf.Tensor] = None
            ) -> tuple[dict[str, tf.Tensor], Optional[tf.Operation]]:
  """TensorFlow computation `tensorflow` (its graph: `graph_def`) imported
  into the default graph under `name`, as TFF's
  `tensorflow_utils.deserialize_and_call_tf_computation` imports it (the
  same bindings and session token): its parameters bound by `input_map`.

  Returns:
    Its result's tensors by name, and its initializer (None if it has none).
  """
  input_map = dict(input_map)
  if tensorflow.session_token_tensor_name:
    input_map[tensorflow.session_token_tensor_name] = (
        tf.compat.v1.placeholder_with_default('in_process', shape=[])
        if token is None else token)
  if input_map:
    input_map = graph_utils.add_control_dep_mappings(input_map)
  return_elements = tensorflow_utils.extract_tensor_names_from_binding(
      tensorflow.result)
  if tensorflow.initialize_op:
    return_elements.append(tensorflow.initialize_op)
  outputs = tf.graph_util.import_graph_def(graph_def, input_map,
                                           return_elements, name=name)
  output_map = dict(zip(return_elements, outputs))
  init_op = (output_map.pop(tensorflow.initialize_op)
             if tensorflow.initialize_op else None)
  return output_map, init_op


def _struct_map(value: Any, type_spec: tff.StructType,
                fn: Callable[[Any, tff.Type], Any]) -> structure.Struct:
  """`fn(element, its type)` for each element of `value` (a `Struct` or a
  Python container) of struct type `type_spec`."""
  if not isinstance(value, structure.Struct):
    value = structure.from_container(value)
  return structure.Struct([
      (name, fn(element, element_type))
      for (name, element), (_, element_type) in zip(
          structure.iter_elements(value), structure.iter_elements(type_spec))])


def _assemble(type_spec: tff.Type, binding: pb.TensorFlow.Binding,
              leaf: Callable[[str], Any]) -> Any:
  """A TensorFlow computation's result as a structure of `leaf(name)` for
  the name of each of its tensors."""
  kind = binding.WhichOneof('binding')
  if isinstance(type_spec, tff.TensorType) and kind == 'tensor':
    return leaf(binding.tensor.tensor_name)
  if isinstance(type_spec, tff.StructType) and kind == 'struct':
    return structure.Struct([
        (name, _assemble(element_type, element_binding, leaf))
        for (name, element_type), element_binding in zip(
            structure.iter_elements(type_spec), binding.struct.element)])
  raise UnsupportedComputationError(
      f'a TensorFlow result of type {type_spec} bound as {kind}')


class _SessionPool:
  """Sessions of one graph, made by `make()`: one per concurrent call (a
  session's variables are its own, so concurrent calls never share them)."""

  def __init__(self, make: Callable[[], '_Session']):
    self._make = make
    self._sessions = queue.SimpleQueue()

  def run(self, feeds: list[Any], placement: Any,
          add: Optional[Callable[[Any], None]]) -> list[Any]:
    """The graph's fetches for `feeds`, in a free session; traced, and the
    trace given to `add`, while `placement` (if any) is recording."""
    try:
      session = self._sessions.get_nowait()
    except queue.Empty:
      session = self._make()
    try:
      if placement is None or not placement.recording:
        return session(feeds)
      with _TRACE_LOCK:  # TensorFlow traces one run at a time.
        values, metadata = session.traced(feeds)
      add(metadata)
      return values
    finally:
      self._sessions.put(session)

  def close(self) -> None:
    while True:
      try:
        self._sessions.get_nowait().session.close()
      except queue.Empty:
        return


class _Session:
  """A session of one computation's graph, called as TensorFlow's own
  callables call it.

  `Session.run` (and `make_callable` with feeds, which delegates to it)
  rebuilds its fetch and feed bookkeeping at every call: ~0.3 ms, as much as
  running a small computation. This calls the session the way
  `make_callable` does without feeds (`Session._call_tf_sessionrun` on the
  graph's outputs), with the feeds given as arrays of the placeholders'
  dtypes. TensorFlow's private API, used here only.
  """

  def __init__(self, graph, config, init_op, placeholders, fetches):
    self.session = tf.compat.v1.Session(graph=graph, config=config)
    self.session._extend_graph()  # pylint: disable=protected-access
    # pylint: disable=protected-access
    self._feeds = [p._as_tf_output() for p in placeholders]
    self._fetches = [t._as_tf_output() for t in fetches]
    self._init_targets = [] if init_op is None else [init_op._c_op]
    # pylint: enable=protected-access
    self._placeholders = placeholders
    self._init_op = init_op
    self._fetch_tensors = fetches

  def _run(self, feed_dict, fetches, targets):
    return self.session._call_tf_sessionrun(  # pylint: disable=protected-access
        None, feed_dict, fetches, targets, None)

  def __call__(self, feeds: list[Any]) -> list[Any]:
    if not self._fetches:  # An empty result: nothing to compute.
      return []
    feed_dict = dict(zip(self._feeds, feeds))
    if self._init_targets:
      self._run(feed_dict, [], self._init_targets)
    return self._run(feed_dict, self._fetches, [])

  def traced(self, feeds: list[Any]) -> tuple[list[Any], Any]:
    if not self._fetches:
      return [], tf.compat.v1.RunMetadata()
    feed_dict = dict(zip(self._placeholders, feeds))
    if self._init_op is not None:
      self.session.run(self._init_op, feed_dict)
    metadata = tf.compat.v1.RunMetadata()
    values = self.session.run(
        self._fetch_tensors, feed_dict, options=tf.compat.v1.RunOptions(
            trace_level=tf.compat.v1.RunOptions.FULL_TRACE),
        run_metadata=metadata)
    return values, metadata


def _flatten_leaves(value: Any, leaves: list[Any]) -> None:
  """The tensors and datasets of `value`, in TFF's element order."""
  if isinstance(value, (np.ndarray, np.generic, tf.data.Dataset, tf.Tensor,
                        int, float, bool, str, bytes)):
    leaves.append(value)
    return
  try:
    elements = structure.from_container(value)
  except TypeError:
    leaves.append(value)
    return
  for _, element in structure.iter_elements(elements):
    _flatten_leaves(element, leaves)


def session_config(threads: int,
                   inter_op: Optional[int] = None) -> tf.compat.v1.ConfigProto:
  """A session's config: this process's TensorFlow configuration (its
  logical devices, GPU memory options: what a `tf.compat.v1.Session` made
  without a config gets), with pools of `threads` threads of its own and
  soft placement (ops without a kernel for the device, such as tf.data's,
  run on the CPU). `inter_op`: threads running independent ops at once
  (default `threads`)."""
  config = tf.compat.v1.ConfigProto()
  # TensorFlow's eager context holds the configuration that `tf.config`
  # sets; no public API returns it as a ConfigProto.
  config.CopyFrom(tf_context.context().config)
  config.intra_op_parallelism_threads = threads
  config.inter_op_parallelism_threads = inter_op or threads
  config.use_per_session_threads = True
  config.allow_soft_placement = True
  return config


_TRACE_LOCK = threading.Lock()


class Placement:
  """Where a device's computations ran: ops executed per TensorFlow device,
  for client computations (`federated_map`'s) and the others (server
  update, merges), from each call's `RunMetadata`."""

  def __init__(self):
    self._lock = threading.Lock()
    self.ops = {'clients': {}, 'server': {}}
    self.recording = True  # False: calls run untraced from then on.

  def add(self, metadata: tf.compat.v1.RunMetadata, role: str) -> None:
    with self._lock:
      counts = self.ops[role]
      for device_stats in metadata.step_stats.dev_stats:
        # '/job:localhost/replica:0/task:0/device:GPU:0/stream:all' ->
        # '/device:GPU:0'.
        name = _device_name(
            device_stats.device.partition('/device:')[2].split('/')[0])
        real = [n for n in device_stats.node_stats
                if not n.node_name.startswith('_')]
        if real:
          counts[name] = counts.get(name, 0) + len(real)


  def add_scoped(self, metadata: tf.compat.v1.RunMetadata) -> None:
    """As `add`, for a `_Plan`'s run: its client computations' ops are
    named under scopes starting with `c`, the others' with `s`."""
    clients = tf.compat.v1.RunMetadata()
    server = tf.compat.v1.RunMetadata()
    for device_stats in metadata.step_stats.dev_stats:
      for target, keep in ((clients, True), (server, False)):
        stats = target.step_stats.dev_stats.add(device=device_stats.device)
        stats.node_stats.extend(
            n for n in device_stats.node_stats
            if n.node_name.startswith('c') == keep)
    self.add(clients, 'clients')
    self.add(server, 'server')


class _RolePlacement:
  """A `Placement` seen by the computations of one role."""

  def __init__(self, placement: Placement, role: str):
    self._placement = placement
    self._role = role

  @property
  def recording(self) -> bool:
    return self._placement.recording

  def add(self, metadata: tf.compat.v1.RunMetadata) -> None:
    self._placement.add(metadata, self._role)


class Device:
  """Where and how a device's computations run.

  Args:
    name: A TensorFlow device name, e.g. `/device:CPU:0`, `/device:GPU:1`.
    lanes: How many client computations run at once on it.
    threads_per_lane: Threads of each client computation's session.
    threads: Threads of the other computations' sessions.
    record_placement: Whether to trace every call and count the ops run on
      each TensorFlow device (`placement`; slower: for tests and the bench).
  """

  def __init__(self, name: str, lanes: int, threads_per_lane: int,
               threads: int, record_placement: bool = False):
    self.name = name
    self.lanes = max(1, lanes)
    self.threads_per_lane = max(1, threads_per_lane)
    self.threads = max(1, threads)
    self.client_config = session_config(self.threads_per_lane)
    self.server_config = session_config(self.threads)
    self.placement = Placement() if record_placement else None
    # Compiled computation -> its TensorFlow computations' graphs, by
    # (id of the proto, for clients): dropped with the computation (a
    # context compiles a computation once and keeps it while it is used).
    self._graphs = IdentityCache()
    # Compiled computation -> {argument layout: [calls, its _Plan, or False
    # when it cannot be planned]}.
    self._plans = IdentityCache()
    self.plan_config = session_config(self.threads_per_lane,
                                      inter_op=self.threads)
    # Computations called, planned or interpreted (for tests, the bench).
    self.calls = collections.Counter()
    self._lock = threading.Lock()
    self.pool = concurrent.futures.ThreadPoolExecutor(
        max_workers=self.lanes, thread_name_prefix='in_process_lane')

  def plan(self, comp: tff.Computation, layout: tuple[Any, ...],
           make: Callable[[], '_Plan']) -> Optional['_Plan']:
    """The plan of calls of `comp` with arguments of `layout`, made by
    `make()` at the call after the first `PLAN_AFTER_CALLS` (the first
    calls, often the only ones, run interpreted); None to interpret (too
    early, or `comp` cannot be planned)."""
    plans = self._plans.get(comp, dict)
    with self._lock:
      entry = plans.setdefault(layout, [0, None])
      entry[0] += 1
      if entry[1] is not None or entry[0] <= PLAN_AFTER_CALLS:
        return entry[1] or None
      if sum(bool(e[1]) for e in plans.values()) >= MAX_PLANS:
        entry[1] = False  # Many layouts (cohorts of many sizes): memory.
        return None
    try:
      built = make()
    except (UnsupportedComputationError, _TooLarge):
      built = False  # Interpreted from now on.
    with self._lock:
      if entry[1] is None:
        entry[1] = built
      return entry[1] or None

  def never_plan(self, comp: tff.Computation, layout: tuple[Any, ...]) -> None:
    """Calls of `comp` with arguments of `layout` stay interpreted (each
    calls more TensorFlow computations than a plan may import)."""
    plans = self._plans.get(comp, dict)
    with self._lock:
      plans.setdefault(layout, [0, None])[1] = False

  def graphs_for(self, comp: tff.Computation) -> dict[Any, Any]:
    """The graphs of compiled computation `comp`'s TensorFlow."""
    return self._graphs.get(comp, dict)

  def computation(self, graphs: dict[Any, Any], proto: pb.Computation,
                  for_clients: bool) -> _TensorFlowComputation:
    """The graph of TensorFlow computation `proto`, a message of the
    compiled computation whose `graphs_for` are `graphs`."""
    # A compiled computation's proto is the same object at every call; each
    # of its TensorFlow computations is a message of it, the same Python
    # object while it lives (protobuf keeps one per message), and is kept
    # alive here with its graph.
    key = (id(proto), for_clients)
    with self._lock:
      entry = graphs.get(key)
      if entry is None:
        entry = (proto, _TensorFlowComputation(
            proto, self.name,
            self.client_config if for_clients else self.server_config,
            None if self.placement is None else _RolePlacement(
                self.placement, 'clients' if for_clients else 'server')))
        graphs[key] = entry
    return entry[1]

  def close(self) -> None:
    self.pool.shutdown(wait=True)
    with self._lock:
      for graphs in self._graphs.values():
        for _, computation in graphs.values():
          computation.close()
        graphs.clear()
      for plans in self._plans.values():
        for _, plan in plans.values():
          if plan:
            plan.close()
        plans.clear()


def _device_name(name: str) -> str:
  """`GPU:1`, `gpu`, `/device:GPU:1`, `/GPU:1` -> `/device:GPU:1`."""
  name = name.strip()
  for prefix in ('/device:', '/'):
    if name.lower().startswith(prefix.lower()):
      name = name[len(prefix):]
  kind, _, index = name.partition(':')
  return f'/device:{kind.upper()}:{index or 0}'


def visible_devices() -> list[str]:
  """This process's TensorFlow devices (logical ones included)."""
  return [_device_name(d.name) for d in tf.config.list_logical_devices()
          if d.device_type in ('CPU', 'GPU')]


def check_devices(names: Optional[Sequence[str]] = None) -> list[str]:
  """The full names of `names` (default: every visible GPU, else the CPU).

  Raises:
    ValueError: If a device is not visible to TensorFlow or named twice.
  """
  visible = visible_devices()
  if not names:
    gpus = [d for d in visible if '/device:GPU:' in d]
    return gpus or ['/device:CPU:0']
  chosen = [_device_name(n) for n in names]
  for name in chosen:
    if name not in visible:
      raise ValueError(f'device {name} is not visible to TensorFlow (visible:'
                       f' {", ".join(visible)})')
  if len(set(chosen)) != len(chosen):
    raise ValueError(f'a device is named twice: {", ".join(chosen)}')
  return chosen


def plan_devices(names: Optional[Sequence[str]] = None,
                 cores: Optional[int] = None,
                 record_placement: bool = False) -> list[Device]:
  """The devices a runtime computes on, each with its lanes and threads.

  Args:
    names: TensorFlow devices (`GPU:0`, `CPU:0`, ...); default: every
      visible GPU, else the CPU. Clients are spread over them, the server
      update runs on the first.
    cores: CPU cores to use (default: those this process may run on).
    record_placement: As for `Device`.

  Returns:
    One `Device` per name. On the CPU, one client computation per core at a
    time, each on one thread (the cores shared among the CPU devices named);
    on a GPU, two at a time (one computes while the other's inputs are
    prepared), the cores shared among the GPUs for that host work.

  Raises:
    ValueError: If a device is not visible to TensorFlow or named twice.
  """
  cores = cores or len(os.sched_getaffinity(0)) or 1
  chosen = check_devices(names)
  num_cpus = sum('/device:CPU:' in n for n in chosen)
  num_gpus = len(chosen) - num_cpus
  devices = []
  for name in chosen:
    if '/device:GPU:' in name:
      devices.append(Device(name, lanes=2,
                            threads_per_lane=max(1, cores // (2 * num_gpus)),
                            threads=cores, record_placement=record_placement))
    else:
      devices.append(Device(name, lanes=max(1, cores // num_cpus),
                            threads_per_lane=1, threads=cores,
                            record_placement=record_placement))
  return devices


def calls_at_once(names: Optional[Sequence[str]] = None) -> int:
  """How many client computations `plan_devices(names)` runs at once."""
  devices = plan_devices(names)
  for device in devices:
    device.close()
  return sum(device.lanes for device in devices)


class _Value(executor_value_base.ExecutorValue):

  def __init__(self, value: Any, type_spec: tff.Type, num_clients: int):
    self._value = value
    self._type_spec = type_spec
    self._num_clients = num_clients

  @property
  def type_signature(self) -> tff.Type:
    return self._type_spec

  @property
  def internal(self) -> Any:
    return self._value

  @property
  def reference(self) -> Any:
    return self._value

  async def compute(self) -> Any:
    return _to_python(self._value, self._type_spec, self._num_clients)


def _to_python(value: Any, type_spec: tff.Type, num_clients: int) -> Any:
  """A value as TFF's contexts take results: structs as `Struct`, a
  CLIENTS-placed value (not all equal) as a list of its clients' values."""
  if isinstance(value, _Federated):
    if type_spec.all_equal:
      return _to_python(value.members[0], type_spec.member, num_clients)
    count = num_clients if value.all_equal else len(value.members)
    return [_to_python(value.member(k), type_spec.member, num_clients)
            for k in range(count)]
  if isinstance(type_spec, tff.StructType):
    elements = structure.from_container(value)
    return structure.Struct([
        (name, _to_python(element, element_type, num_clients))
        for (name, element), (_, element_type) in zip(
            structure.iter_elements(elements),
            structure.iter_elements(type_spec))])
  if isinstance(value, (_Closure, _Intrinsic, _TensorFlowFunction)):
    raise UnsupportedComputationError('returning a function')
  return value


class IdentityCache:
  """Values kept per object, by identity, while the object lives.

  Not a `WeakKeyDictionary`: a TFF computation's hash serializes its whole
  proto (0.3-0.6 ms a round for the few lookups here).
  """

  def __init__(self):
    self._entries = {}  # id -> (weak reference, value)
    self._lock = threading.Lock()

  def get(self, key: Any, make: Callable[[], Any]) -> Any:
    """The value kept for `key`, made by `make()` the first time (outside
    the lock: two threads may both make it, the first one made is kept)."""
    with self._lock:
      entry = self._entries.get(id(key))
      if entry is not None and entry[0]() is key:
        return entry[1]
    value = make()
    with self._lock:
      entry = self._entries.get(id(key))
      if entry is not None and entry[0]() is key:
        return entry[1]
      self._entries[id(key)] = (weakref.ref(key, self._drop(id(key))), value)
      return value

  def _drop(self, key_id: int):
    def drop(reference):
      with self._lock:
        entry = self._entries.get(key_id)
        if entry is not None and entry[0] is reference:
          del self._entries[key_id]
    return drop

  def values(self) -> list[Any]:
    with self._lock:
      return [value for _, value in self._entries.values()]


# Computation -> its proto, taken once. The contexts (TFF's compiler
# pipeline, `contexts._InProcessContext`) give the same compiled computation
# at every call of a computation, and the graphs
# a device imports are kept by the identity of their protos.
_PROTOS = IdentityCache()


def _proto(comp: tff.Computation) -> pb.Computation:
  return _PROTOS.get(comp, lambda: comp.to_compiled_building_block().proto)


# Plans. A round of a small model is mostly the evaluation above: a few
# hundred building blocks walked in Python and a dozen session calls around
# ~2 ms of TensorFlow. From its second call with the same layout of its
# argument (how many members each placed value has), a computation runs as
# a `_Plan`: one TensorFlow graph into which that walk imported each of its
# TensorFlow computations, wired as the walk wires them, run in one session
# call (two with initializers). Module settings, for tests and the bench.
PLANS = True  # False: every call interpreted.
PLAN_AFTER_CALLS = 1  # Calls of a layout interpreted before it is planned.
MAX_IMPORTS = 128  # A larger call (one client per call, big cohorts) is
# interpreted: importing that many graphs costs more than it saves.
MAX_PLANS = 8  # Layouts planned per computation; others are interpreted.


_recorded = threading.local()


@contextlib.contextmanager
def recording_plans():
  """Within it, each plan run on this thread is recorded: yields the list
  of `(plan, leaves, fetched values)` it appends to (`shortcuts`)."""
  calls = []
  _recorded.calls = calls
  try:
    yield calls
  finally:
    _recorded.calls = None


class _TooLarge(Exception):
  """A plan would import more than `MAX_IMPORTS` TensorFlow computations."""


class _SymbolicSequence:
  """A plan's dataset parameter: the placeholder of its serialized graph."""

  __slots__ = ('graph_def',)

  def __init__(self, graph_def: tf.Tensor):
    self.graph_def = graph_def


class _Out:
  """A result leaf to fill: the index of its fetched tensor."""

  __slots__ = ('index',)

  def __init__(self, index: int):
    self.index = index


def _layout(value: Any, type_spec: tff.Type, leaves: list[Any]) -> tuple:
  """`value`'s tensors and datasets appended to `leaves` (in a plan's
  parameter order) and its layout: (all equal, members) of each placed
  value, in that order."""
  layout = []

  def walk(value, type_spec):
    if isinstance(type_spec, tff.FederatedType):
      if not isinstance(value, _Federated):
        raise UnsupportedComputationError('an unplaced federated value')
      layout.append((value.all_equal, len(value.members)))
      for member in value.members:
        walk(member, type_spec.member)
    elif isinstance(type_spec, tff.StructType):
      if not isinstance(value, structure.Struct):
        try:
          value = structure.from_container(value)
        except TypeError as e:
          raise UnsupportedComputationError(str(e)) from e
      if len(value) != len(type_spec):
        raise UnsupportedComputationError('a struct of another length')
      for element, (_, element_type) in zip(
          structure.iter_elements(value), structure.iter_elements(type_spec)):
        walk(element[1], element_type)
    elif isinstance(type_spec, (tff.TensorType, tff.SequenceType)):
      leaves.append(value)
    else:
      raise UnsupportedComputationError(f'a parameter of type {type_spec}')

  walk(value, type_spec)
  return tuple(layout)


class _Plan:
  """One computation's calls for one layout of their argument, as one
  TensorFlow graph on `device`.

  Built by evaluating the computation as `_Evaluator` does, with the
  argument's tensors as placeholders and each TensorFlow computation called
  imported into the graph (under a scope `c<k>` for client work, `s<k>`
  otherwise) rather than run; a call feeds the argument's leaves and fetches
  the result's tensors. Variables of the imported copies are their own (the
  `shared_name` of each stateful op is made unique) and initialized at
  every call, as each interpreted call initializes its graph. Independent
  imports (clients, shards) run at once on the session's `inter_op` threads,
  as `lanes` run them interpreted.

  Raises:
    UnsupportedComputationError: If the call returns a function or a
      dataset, or takes a parameter the plan cannot stand in for.
    _TooLarge: If the call imports over `MAX_IMPORTS` computations.
  """

  def __init__(self, device: Device, proto: pb.Computation,
               function_type: tff.FunctionType, arg: Any, num_clients: int):
    self._device = device
    self._graph = tf.Graph()
    self._feeds = []  # (placeholder, kind, dtype) in `_layout`'s order.
    self._init_ops = []
    self._fetches = []
    self._imports = 0
    self._function_suffixes = {}  # id(proto) -> suffix of its functions.
    with self._graph.as_default(), tf.device(device.name):
      with self._graph.name_scope('s'):
        self._token = tf.compat.v1.placeholder_with_default(
            'in_process', shape=[])
        symbolic = (None if arg is None else
                    self._parameter(arg, function_type.parameter))
      evaluator = _Evaluator(device, num_clients, {}, plan=self)
      result = evaluator.call(evaluator.evaluate(proto, {}), symbolic)
      self._template = self._output(result)
      init_op = (tf.group(*self._init_ops, name='s_init')
                 if self._init_ops else None)
    self._graph.finalize()
    self._sessions = _SessionPool(lambda: _Session(
        self._graph, device.plan_config, init_op,
        [placeholder for placeholder, _, _ in self._feeds], self._fetches))

  def _parameter(self, value: Any, type_spec: tff.Type) -> Any:
    """`value` with a placeholder for each tensor and dataset."""
    if isinstance(type_spec, tff.FederatedType):
      return _Federated(value.placement, value.all_equal, [
          self._parameter(member, type_spec.member)
          for member in value.members])
    if isinstance(type_spec, tff.StructType):
      return _struct_map(value, type_spec, self._parameter)
    if isinstance(type_spec, tff.TensorType):
      dtype = tf.dtypes.as_dtype(type_spec.dtype)
      placeholder = tf.compat.v1.placeholder(dtype, shape=type_spec.shape)
      self._feeds.append((placeholder, 'tensor', dtype.as_numpy_dtype))
      return placeholder
    with tf.device('/device:CPU:0'):  # A SequenceType (`_layout`).
      graph_def = tf.compat.v1.placeholder(tf.string, shape=[])
    self._feeds.append((graph_def, 'sequence', None))
    return _SymbolicSequence(graph_def)

  def import_call(self, proto: pb.Computation, for_clients: bool,
                  arg: Any) -> Any:
    """TensorFlow computation `proto` on `arg` (tensors of this graph),
    imported: its result's tensors."""
    self._imports += 1
    if self._imports > MAX_IMPORTS:
      raise _TooLarge()
    scope = f'{"c" if for_clients else "s"}{self._imports}'
    function_type = type_serialization.deserialize_type(proto.type)
    tensorflow = proto.tensorflow
    input_map = {}
    if function_type.parameter is not None:
      leaves = []
      _flatten_leaves(arg, leaves)
      leaves = iter(leaves)
      self._bind(function_type.parameter, tensorflow.parameter, leaves,
                 input_map, scope)
      if next(leaves, None) is not None:
        raise UnsupportedComputationError('more values than parameters')
    graph_def = serialization_utils.unpack_graph_def(tensorflow.graph_def)
    for node in graph_def.node:
      shared = node.attr.get('shared_name')
      if shared is not None and shared.s:
        shared.s += f'/{scope}'.encode()
      if node.op in ('Enter', 'RefEnter'):  # A loop's frame: one per import.
        node.attr['frame_name'].s = (f'{scope}/'.encode() +
                                     node.attr['frame_name'].s)
    # Computations traced apart can give different functions one name;
    # every import of one computation shares its functions.
    _rename_functions(graph_def, self._function_suffixes.setdefault(
        id(proto), f'_plan{len(self._function_suffixes)}'))
    output_map, init_op = _import(tensorflow, graph_def, input_map, scope,
                                  self._token)
    if init_op is not None:
      self._init_ops.append(init_op)
    return _assemble(function_type.result, tensorflow.result,
                     output_map.__getitem__)

  def _bind(self, type_spec, binding, leaves, input_map, scope) -> None:
    kind = binding.WhichOneof('binding')
    if isinstance(type_spec, tff.StructType) and kind == 'struct':
      for (_, element_type), element_binding in zip(
          structure.iter_elements(type_spec), binding.struct.element):
        self._bind(element_type, element_binding, leaves, input_map, scope)
      return
    leaf = next(leaves, None)
    if isinstance(type_spec, tff.TensorType) and kind == 'tensor':
      if isinstance(leaf, (np.ndarray, np.generic, int, float, bool, str,
                           bytes)):  # A literal of the computation.
        leaf = tf.constant(np.asarray(
            leaf, tf.dtypes.as_dtype(type_spec.dtype).as_numpy_dtype),
                           name=f'{scope}_literal')
      if not isinstance(leaf, tf.Tensor):
        raise UnsupportedComputationError(
            f'a tensor parameter given {type(leaf).__name__}')
      input_map[binding.tensor.tensor_name] = leaf
    elif (isinstance(type_spec, tff.SequenceType) and kind == 'sequence' and
          isinstance(leaf, _SymbolicSequence)):
      sequence = binding.sequence
      if sequence.WhichOneof('binding') == 'graph_def_tensor_name':
        input_map[sequence.graph_def_tensor_name] = leaf.graph_def
      else:
        with tf.device('/device:CPU:0'):
          input_map[sequence.variant_tensor_name] = (
              tf.raw_ops.DatasetFromGraph(graph_def=leaf.graph_def,
                                          name=f'{scope}_dataset'))
    else:
      raise UnsupportedComputationError(
          f'a TensorFlow parameter of type {type_spec} bound as {kind}')

  def _output(self, value: Any) -> Any:
    """The result's structure, with an `_Out` for each fetched tensor."""
    if isinstance(value, _Federated):
      return _Federated(value.placement, value.all_equal,
                        [self._output(member) for member in value.members])
    if isinstance(value, structure.Struct):
      return structure.Struct([(name, self._output(element)) for name, element
                               in structure.iter_elements(value)])
    if isinstance(value, tf.Tensor):
      if value.op.type == 'Placeholder':  # Fed: passed through.
        value = tf.identity(value, name='s_passed')
      self._fetches.append(value)
      return _Out(len(self._fetches) - 1)
    if isinstance(value, (np.ndarray, np.generic)):
      return value  # A literal.
    raise UnsupportedComputationError(
        f'a plan returning {type(value).__name__}')

  def __call__(self, leaves: list[Any]) -> Any:
    """The result for the argument whose `_layout` leaves are `leaves`."""
    return _filled(self._template, self.run(leaves))

  @property
  def feeds(self) -> list[tuple[Any, str, Any]]:
    """(placeholder, 'tensor' or 'sequence', NumPy dtype) per parameter
    leaf, in `_layout`'s order."""
    return list(self._feeds)

  def literals(self) -> list[Any]:
    """The result's leaves that are not fetched (constants of the plan)."""
    found = []

    def walk(template):
      if isinstance(template, _Out):
        return
      if isinstance(template, _Federated):
        for member in template.members:
          walk(member)
      elif isinstance(template, structure.Struct):
        for _, element in structure.iter_elements(template):
          walk(element)
      else:
        found.append(template)

    walk(self._template)
    return found

  def run(self, leaves: list[Any]) -> list[Any]:
    """The fetched tensors' values for the argument whose `_layout` leaves
    are `leaves` (`__call__` puts them in the result's structure)."""
    if len(leaves) != len(self._feeds):
      raise TypeError(f'{len(leaves)} values for {len(self._feeds)} '
                      'parameters of a plan.')
    feeds = [_serialize_value(leaf, kind, dtype)
             for (_, kind, dtype), leaf in zip(self._feeds, leaves)]
    placement = self._device.placement
    values = self._sessions.run(
        feeds, placement, None if placement is None else placement.add_scoped)
    calls = getattr(_recorded, 'calls', None)
    if calls is not None:
      calls.append((self, leaves, values))
    return values

  def close(self) -> None:
    self._sessions.close()


def _rename_functions(graph_def: tf.compat.v1.GraphDef, suffix: str) -> None:
  """Each function of `graph_def`'s library, and each use of it, renamed
  with `suffix`."""
  library = graph_def.library
  names = {f.signature.name for f in library.function}
  if not names:
    return

  def rename_attr(value):
    kind = value.WhichOneof('value')
    if kind == 'func' and value.func.name in names:
      value.func.name += suffix
    elif kind == 'list':
      for func in value.list.func:
        if func.name in names:
          func.name += suffix

  def rename_nodes(nodes):
    for node in nodes:
      if node.op in names:
        node.op += suffix
      for value in node.attr.values():
        rename_attr(value)

  rename_nodes(graph_def.node)
  for function in library.function:
    function.signature.name += suffix
    rename_nodes(function.node_def)
    for value in function.attr.values():
      rename_attr(value)
  for gradient in library.gradient:
    if gradient.function_name in names:
      gradient.function_name += suffix
    if gradient.gradient_func in names:
      gradient.gradient_func += suffix


def _filled(template: Any, values: list[Any]) -> Any:
  if isinstance(template, _Out):
    return values[template.index]
  if isinstance(template, _Federated):
    return _Federated(template.placement, template.all_equal,
                      [_filled(member, values) for member in template.members])
  if isinstance(template, structure.Struct):
    return structure.Struct([(name, _filled(element, values)) for name, element
                             in structure.iter_elements(template)])
  return template


class InProcessExecutor(executor_base.Executor):
  """Evaluates compiled TFF computations in this process, on one device.

  Args:
    device: The `Device` every TensorFlow computation runs on.
    cardinalities: The number of clients (`{tff.CLIENTS: n}`).
  """

  def __init__(self, device: Device, cardinalities: dict[Any, int]):
    self._device = device
    self._num_clients = cardinalities.get(placements.CLIENTS, 0)

  def close(self) -> None:
    pass

  async def create_value(self, value: Any, type_spec: Any = None) -> _Value:
    type_spec = tff.types.to_type(type_spec) if type_spec is not None else None
    if isinstance(value, tff.Computation):
      return _Value(value, value.type_signature, self._num_clients)
    return _Value(self._ingest(value, type_spec), type_spec,
                  self._num_clients)

  def _ingest(self, value: Any, type_spec: tff.Type) -> Any:
    if isinstance(type_spec, tff.FederatedType):
      if type_spec.all_equal:
        members = [value]
      else:
        members = list(value)
        if (type_spec.placement is placements.CLIENTS and
            len(members) != self._num_clients):
          raise ValueError(f'{len(members)} client values for '
                           f'{self._num_clients} clients.')
      return _Federated(type_spec.placement, type_spec.all_equal, members)
    if isinstance(type_spec, tff.StructType):
      return _struct_map(value, type_spec, self._ingest)
    return value

  async def create_call(self, comp: _Value,
                        arg: Optional[_Value] = None) -> _Value:
    function_type = comp.type_signature
    plan = layout = None
    if PLANS:
      leaves = []
      try:
        layout = (() if arg is None else
                  _layout(arg.internal, function_type.parameter, leaves))
      except UnsupportedComputationError:
        layout = None
      if layout is not None:
        plan = self._device.plan(comp.internal, layout, lambda: _Plan(
            self._device, _proto(comp.internal), function_type,
            None if arg is None else arg.internal, self._num_clients))
    self._device.calls['planned' if plan is not None else 'interpreted'] += 1
    if plan is not None:
      value = plan(leaves)
    else:
      evaluator = _Evaluator(self._device, self._num_clients,
                             self._device.graphs_for(comp.internal))
      value = evaluator.call(evaluator.evaluate(_proto(comp.internal), {}),
                             None if arg is None else arg.internal)
      if layout is not None and evaluator.tf_calls > MAX_IMPORTS:
        self._device.never_plan(comp.internal, layout)
    return _Value(value, function_type.result, self._num_clients)

  async def create_struct(self, elements) -> _Value:
    elements = structure.to_elements(elements)
    return _Value(
        structure.Struct([(name, v.internal) for name, v in elements]),
        tff.StructType([(name, v.type_signature) for name, v in elements]),
        self._num_clients)

  async def create_selection(self, source: _Value, index: int) -> _Value:
    return _Value(source.internal[index], source.type_signature[index],
                  self._num_clients)


class _Evaluator:
  """The compiled computation's building blocks, evaluated in Python."""

  def __init__(self, device: Device, num_clients: int,
               graphs: dict[Any, Any], for_clients: bool = False,
               plan: Optional['_Plan'] = None,
               tf_calls: Optional[list[int]] = None):
    self._device = device
    # TensorFlow computations called (the clients' evaluators share it).
    self._tf_calls = [0] if tf_calls is None else tf_calls
    self._num_clients = num_clients
    self._graphs = graphs
    self._for_clients = for_clients
    # Building a `_Plan`: TensorFlow calls are imported into its graph, not
    # run.
    self._plan = plan

  def evaluate(self, proto: pb.Computation, env: dict[str, Any]) -> Any:
    kind = proto.WhichOneof('computation')
    if kind == 'reference':
      return env[proto.reference.name]
    if kind == 'call':
      call = proto.call
      function = self.evaluate(call.function, env)
      arg = (self.evaluate(call.argument, env)
             if call.HasField('argument') else None)
      return self.call(function, arg)
    if kind == 'struct':
      return structure.Struct([
          (element.name or None, self.evaluate(element.value, env))
          for element in proto.struct.element])
    if kind == 'selection':
      source = self.evaluate(proto.selection.source, env)
      if not isinstance(source, structure.Struct):
        # A Python container given by the caller (dict, attrs, list).
        source = structure.from_container(source)
      return source[proto.selection.index]
    if kind == 'lambda':
      return _Closure(proto, env)
    if kind == 'block':
      env = dict(env)
      for local in proto.block.local:
        env[local.name] = self.evaluate(local.value, env)
      return self.evaluate(proto.block.result, env)
    if kind == 'literal':
      return array.from_proto(proto.literal.value)
    if kind == 'intrinsic':
      return _Intrinsic(proto.intrinsic.uri)
    if kind == 'tensorflow':
      return _TensorFlowFunction(proto)
    raise UnsupportedComputationError(f'a computation of kind {kind}')

  @property
  def tf_calls(self) -> int:
    return self._tf_calls[0]

  def call(self, function: Any, arg: Any) -> Any:
    if isinstance(function, _Closure):
      function_proto = getattr(function.block, 'lambda')
      env = function.env
      if function_proto.parameter_name:
        env = dict(env)
        env[function_proto.parameter_name] = arg
      return self.evaluate(function_proto.result, env)
    if isinstance(function, _TensorFlowFunction):
      if self._plan is not None:
        return self._plan.import_call(function.proto, self._for_clients, arg)
      self._tf_calls[0] += 1  # Under threads, a count to within a few.
      return self._device.computation(self._graphs, function.proto,
                                      self._for_clients)(arg)
    if isinstance(function, _Intrinsic):
      handler = _INTRINSICS.get(function.uri)
      if handler is None:
        raise UnsupportedComputationError(f'intrinsic {function.uri}')
      return handler(self, arg)
    raise UnsupportedComputationError(f'calling {type(function).__name__}')

  # Intrinsics.

  def _clients_evaluator(self) -> '_Evaluator':
    return _Evaluator(self._device, self._num_clients, self._graphs,
                      for_clients=True, plan=self._plan,
                      tf_calls=self._tf_calls)

  def map_clients(self, function: Any, values: _Federated,
                  all_equal: bool) -> _Federated:
    """`function` on each client's value, on up to `lanes` at once; once
    for an all-equal result."""
    count = 1 if all_equal else (
        self._num_clients if values.all_equal else len(values.members))
    inner = self._clients_evaluator()
    if count == 1 or self._plan is not None:
      results = [inner.call(function, values.member(k)) for k in range(count)]
    else:
      results = list(self._device.pool.map(
          lambda k: inner.call(function, values.member(k)), range(count)))
    return _Federated(placements.CLIENTS, all_equal, results)

  def federated_map(self, arg) -> _Federated:
    function, values = arg[0], arg[1]
    if values.placement is placements.CLIENTS:
      return self.map_clients(function, values, all_equal=False)
    return _Federated(values.placement, values.all_equal,
                      [self.call(function, m) for m in values.members])

  def federated_map_all_equal(self, arg) -> _Federated:
    return self.map_clients(arg[0], arg[1], all_equal=True)

  def federated_apply(self, arg) -> _Federated:
    function, value = arg[0], arg[1]
    return _Federated(placements.SERVER, True,
                      [self.call(function, value.members[0])])

  def federated_aggregate(self, arg) -> _Federated:
    values, zero, accumulate, _, report = (arg[i] for i in range(5))
    accumulator = zero
    count = self._num_clients if values.all_equal else len(values.members)
    for k in range(count):
      accumulator = self.call(
          accumulate, structure.Struct.unnamed(accumulator, values.member(k)))
    return _Federated(placements.SERVER, True, [self.call(report, accumulator)])

  def federated_broadcast(self, arg) -> _Federated:
    return _Federated(placements.CLIENTS, True, [arg.members[0]])

  def federated_value_at(self, placement):
    def value_at(arg):
      return _Federated(placement, True, [arg])
    return value_at

  def federated_eval_at(self, placement):
    def eval_at(function):
      if placement is placements.CLIENTS:
        inner = self._clients_evaluator()
        return _Federated(placement, False, [
            inner.call(function, None) for _ in range(self._num_clients)])
      return _Federated(placement, True, [self.call(function, None)])
    return eval_at

  def federated_zip_at(self, placement):
    """A struct (nested, as TFF allows) of placed values -> the placed
    struct of their members."""
    def zip_at(arg):
      leaves = []

      def collect(value):
        if isinstance(value, _Federated):
          leaves.append(value)
        else:
          for _, element in structure.iter_elements(value):
            collect(element)

      def member(value, k):
        if isinstance(value, _Federated):
          return value.member(k)
        return structure.Struct([(name, member(element, k)) for name, element
                                 in structure.iter_elements(value)])

      collect(arg)
      all_equal = all(leaf.all_equal for leaf in leaves)
      count = 1 if all_equal else max(
          len(leaf.members) for leaf in leaves if not leaf.all_equal)
      return _Federated(placement, all_equal,
                        [member(arg, k) for k in range(count)])
    return zip_at


_INTRINSICS: dict[str, Callable[[_Evaluator, Any], Any]] = {
    intrinsic_defs.FEDERATED_MAP.uri: _Evaluator.federated_map,
    intrinsic_defs.FEDERATED_MAP_ALL_EQUAL.uri:
        _Evaluator.federated_map_all_equal,
    intrinsic_defs.FEDERATED_APPLY.uri: _Evaluator.federated_apply,
    intrinsic_defs.FEDERATED_AGGREGATE.uri: _Evaluator.federated_aggregate,
    intrinsic_defs.FEDERATED_BROADCAST.uri: _Evaluator.federated_broadcast,
    intrinsic_defs.FEDERATED_VALUE_AT_SERVER.uri:
        lambda self, arg: self.federated_value_at(placements.SERVER)(arg),
    intrinsic_defs.FEDERATED_VALUE_AT_CLIENTS.uri:
        lambda self, arg: self.federated_value_at(placements.CLIENTS)(arg),
    intrinsic_defs.FEDERATED_EVAL_AT_SERVER.uri:
        lambda self, arg: self.federated_eval_at(placements.SERVER)(arg),
    intrinsic_defs.FEDERATED_EVAL_AT_CLIENTS.uri:
        lambda self, arg: self.federated_eval_at(placements.CLIENTS)(arg),
    intrinsic_defs.FEDERATED_ZIP_AT_SERVER.uri:
        lambda self, arg: self.federated_zip_at(placements.SERVER)(arg),
    intrinsic_defs.FEDERATED_ZIP_AT_CLIENTS.uri:
        lambda self, arg: self.federated_zip_at(placements.CLIENTS)(arg),
}


def executor_factory(device: Device) -> executor_factory_lib.ExecutorFactory:
  """TFF's executor factory of `InProcessExecutor`s on `device`."""
  def stack_fn(cardinalities):
    return InProcessExecutor(device, cardinalities)

  return python_executor_stacks.ResourceManagingExecutorFactory(
      executor_stack_fn=stack_fn)


def context_settings(device: Device) -> dict[str, Any]:
  """A TFF execution context's settings, as for the worker but in-process."""
  return dict(
      executor_fn=executor_factory(device),
      compiler_fn=compiler.desugar_and_transform_to_native,
      transform_args=tensorflow_computation.transform_args,
      transform_result=tensorflow_computation.transform_result,
  )
