"""PyTorch integration: data-parallel gradient averaging with gocoll.

- :class:`DistributedGradients` hooks every parameter's gradient
  accumulation, packs ready gradients into buckets (reverse registration
  order, like DDP) and starts an asynchronous average of each bucket as soon
  as it is full, while backward continues; :meth:`~DistributedGradients.synchronize`
  (or :class:`DistributedOptimizer`) waits and unpacks before the optimizer
  step.
- :func:`allreduce_hook` is a DDP communication hook:
  ``ddp.register_comm_hook(comm, gocoll.torch.allreduce_hook)``.
- :func:`broadcast_parameters` gives every rank the root's weights.
- :func:`empty` allocates a tensor in gocollMemAlloc memory.
- Importing this module registers the torch.distributed backend "gocoll"
  (:class:`ProcessGroupGocoll`): ``dist.init_process_group("gocoll")``;
  :func:`monitored_barrier` is ``dist.monitored_barrier`` for its groups
  (torch's accepts gloo only, in 1.13 and 2.6 alike).

Every rank must run the same model and call these in the same order: the
collectives they issue must be identical on every rank.
"""

import contextlib
import ctypes
import inspect
import threading

import torch

from . import _futures, _interrupt, errors
from .comm import Comm

__all__ = ["DistributedGradients", "DistributedOptimizer", "allreduce_hook", "broadcast_parameters",
           "empty"]


def empty(comm, shape, dtype=torch.float32, fallback=True):
    """An uninitialised CPU tensor in gocollMemAlloc memory (the memory the
    shared-memory path reads in place), kept alive by the tensor. With
    ``fallback``, returns ``torch.empty`` if the library cannot allocate."""
    return _empty(comm, shape, dtype, fallback)[0]


def _empty(comm, shape, dtype, fallback):
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    numel = 1
    for s in shape:
        numel *= int(s)
    itemsize = torch.empty((), dtype=dtype).element_size()
    nbytes = max(numel * itemsize, 1)
    try:
        block = comm.mem_alloc(nbytes)
    except (errors.Error, NotImplementedError):
        if not fallback:
            raise
        return torch.empty(shape, dtype=dtype), False
    raw = (ctypes.c_uint8 * nbytes).from_address(block.ptr)
    raw._gocoll_block = block  # the ctypes array (held by the tensor) keeps the block alive
    t = torch.frombuffer(raw, dtype=torch.uint8)[: numel * itemsize].view(dtype).view(shape)
    return t, True


def _comm_of(state):
    if isinstance(state, Comm):
        return state
    c = getattr(state, "comm", None)
    if isinstance(c, Comm):
        return c
    raise TypeError("gocoll.torch: expected a gocoll.Comm (or an object with .comm) as hook state, "
                    "got %s" % type(state).__name__)


# ---------------------------------------------------------------------------
# DDP communication hook


def allreduce_hook(state, bucket):
    """DDP communication hook averaging ``bucket.buffer()`` with gocoll.

    ``state`` is a :class:`gocoll.Comm` (or an object with a ``comm``
    attribute). The allreduce runs asynchronously, in place on DDP's bucket
    buffer; the returned ``torch.futures.Future`` is completed with that
    buffer by the communicator's waiter thread when it finished, or fails
    with gocoll's error, which DDP raises as a RuntimeError carrying
    gocoll's message. While it is in flight, Ctrl-C aborts the communicator
    (DDP waits for it in C++, where Python cannot raise KeyboardInterrupt),
    so the step ends with KeyboardInterrupt instead of waiting for the peers."""
    comm = _comm_of(state)
    buf = bucket.buffer()
    base, fut = _futures.pair()
    try:
        work = comm.all_reduce(buf, op="avg", async_op=True)
    except Exception as e:
        base.set_exception(e)
        return fut
    armed = _interrupt.arm(comm)

    def done(w):
        if armed:
            _interrupt.disarm(comm)
        exc = w.exception()
        if exc is not None:
            base.set_exception(exc)
        else:
            base.set_result(buf)

    comm.on_complete(work, done)
    return fut


# ---------------------------------------------------------------------------
# Broadcasting initial state


def _tensors_of(obj, include_buffers):
    if isinstance(obj, torch.nn.Module):
        ts = [p.data for p in obj.parameters()]
        if include_buffers:
            ts += [b for b in obj.buffers()]
    elif isinstance(obj, dict):
        ts = list(obj.values())
    else:
        ts = list(obj)
    seen, out = set(), []
    for t in ts:
        if not isinstance(t, torch.Tensor):
            continue
        if t.data_ptr() in seen and t.numel():
            continue
        seen.add(t.data_ptr())
        out.append(t)
    return out


@torch.no_grad()
def broadcast_parameters(model, comm, root=0, include_buffers=True, bucket_cap_mb=64):
    """Copy ``root``'s parameters (and buffers) to every rank, in place.

    ``model`` is a module, a state dict or an iterable of tensors. Tensors
    are packed into one flat buffer per dtype (up to ``bucket_cap_mb``) so a
    model with many small tensors costs a few broadcasts."""
    tensors = _tensors_of(model, include_buffers)
    cap = int(bucket_cap_mb * 2 ** 20)
    groups = []  # (dtype, [tensors]) in a fixed order
    current = {}
    for t in tensors:
        g = current.get(t.dtype)
        size = t.numel() * t.element_size()
        if g is None or (g[2] + size > cap and g[1]):
            g = [t.dtype, [], 0]
            groups.append(g)
            current[t.dtype] = g
        g[1].append(t)
        g[2] += size
    for dtype, ts, _ in groups:
        if len(ts) == 1 and ts[0].is_contiguous():
            comm.broadcast(ts[0], src=root)
            continue
        flat = torch.cat([t.reshape(-1) for t in ts]) if comm.rank == root else \
            torch.empty(sum(t.numel() for t in ts), dtype=dtype)
        comm.broadcast(flat, src=root)
        if comm.rank != root:
            off = 0
            for t in ts:
                n = t.numel()
                t.copy_(flat[off:off + n].view_as(t))
                off += n


# ---------------------------------------------------------------------------
# Gradient buckets


class _Bucket:
    __slots__ = ("index", "dtype", "params", "offsets", "numel", "buffer", "pending", "work",
                 "launched")

    def __init__(self, index, dtype):
        self.index = index
        self.dtype = dtype
        self.params = []  # parameter indices, in the order they were added
        self.offsets = []
        self.numel = 0
        self.buffer = None
        self.pending = 0
        self.work = None
        self.launched = False


class DistributedGradients:
    """Average gradients over ``comm`` while backward runs.

    ``DistributedGradients(model, comm, bucket_cap_mb=25)`` registers a hook
    on the gradient accumulator (the AccumulateGrad node) of every parameter
    that requires grad. Parameters are grouped into buckets of at most
    ``bucket_cap_mb`` MiB per dtype, in reverse registration order (the order
    in which backward usually produces them). When every gradient of a bucket
    arrived, the bucket is averaged by a non-blocking allreduce; buckets are
    started strictly in bucket order so that all ranks issue the same
    collectives in the same order. :meth:`synchronize` starts the buckets
    that are still incomplete (a parameter that got no gradient this step
    contributes its current ``.grad``, or zeros when it has none), waits for
    all of them and leaves the averages in ``p.grad``.

    Bucket buffers live in gocollMemAlloc memory (torch.empty if the library
    cannot allocate). With ``gradient_as_bucket_view`` (default), ``p.grad``
    becomes a view into its bucket after the first step, so later backward
    passes accumulate straight into the buffer that is reduced (no copies;
    with ``zero_grad(set_to_none=True)`` gradients are copied in instead).

    ``op`` is "avg" (default) or "sum". With ``find_unused_parameters``, one
    extra small allreduce per step finds parameters that no rank used, whose
    ``.grad`` is then left as it was (None stays None) instead of being set
    to zeros — the same choice DDP makes.

    Use :meth:`no_sync` for gradient accumulation over several backward
    passes, and call :meth:`synchronize` (or :meth:`step`, or wrap the
    optimizer in :class:`DistributedOptimizer`) exactly once per step on
    every rank.
    """

    def __init__(self, model, comm, bucket_cap_mb=25, op="avg", find_unused_parameters=False,
                 gradient_as_bucket_view=True):
        if not isinstance(comm, Comm):
            raise TypeError("DistributedGradients: comm must be a gocoll.Comm, got %s"
                            % type(comm).__name__)
        if op not in ("avg", "sum"):
            raise errors.InvalidArgument("DistributedGradients: op must be 'avg' or 'sum', got %r"
                                         % (op,))
        params = model.parameters() if isinstance(model, torch.nn.Module) else model
        seen, self._params = set(), []
        for p in params:
            if p.requires_grad and id(p) not in seen:
                if p.device.type != "cpu":
                    raise errors.InvalidArgument(
                        "DistributedGradients: parameter on %s; gocoll reduces CPU tensors" % p.device)
                seen.add(id(p))
                self._params.append(p)
        if not self._params:
            raise errors.InvalidArgument("DistributedGradients: the model has no parameter that "
                                         "requires grad")
        self.comm = comm
        self.op = op
        self.find_unused_parameters = find_unused_parameters
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.bucket_cap_bytes = int(bucket_cap_mb * 2 ** 20)
        self._lock = threading.Lock()
        self._enabled = True
        self._build_buckets()
        self._ready = [False] * len(self._params)
        self._next = 0  # next bucket to launch
        self._used = None
        self._grad_accs = []
        self._handles = []
        with torch.enable_grad():
            for i, p in enumerate(self._params):
                acc = p.expand_as(p).grad_fn.next_functions[0][0]
                self._handles.append(acc.register_hook(self._make_hook(i)))
                self._grad_accs.append(acc)  # keep the nodes alive, or the hooks vanish

    # -- buckets ------------------------------------------------------------

    def _build_buckets(self):
        self._buckets = []
        open_by_dtype = {}
        for i in reversed(range(len(self._params))):
            p = self._params[i]
            size = p.numel() * p.element_size()
            b = open_by_dtype.get(p.dtype)
            if b is None or (b.numel * p.element_size() + size > self.bucket_cap_bytes and b.params):
                b = _Bucket(len(self._buckets), p.dtype)
                self._buckets.append(b)
                open_by_dtype[p.dtype] = b
            b.params.append(i)
            b.offsets.append(b.numel)
            b.numel += p.numel()
        self._where = [None] * len(self._params)  # param index -> (bucket, slot view)
        self.uses_gocoll_memory = True
        for b in self._buckets:
            b.buffer, mine = _empty(self.comm, b.numel, b.dtype, True)
            self.uses_gocoll_memory = self.uses_gocoll_memory and mine
            b.buffer.zero_()
            b.pending = len(b.params)
            for i, off in zip(b.params, b.offsets):
                p = self._params[i]
                self._where[i] = (b, b.buffer[off:off + p.numel()].view_as(p))

    @property
    def buckets(self):
        """[(dtype, number of elements, parameter indices)] in launch order."""
        return [(b.dtype, b.numel, list(b.params)) for b in self._buckets]

    # -- hooks --------------------------------------------------------------

    def _make_hook(self, i):
        def hook(*_):
            if self._enabled:
                self._grad_ready(i)
        return hook

    def _grad_ready(self, i):
        p = self._params[i]
        b, slot = self._where[i]
        with self._lock:
            if self._ready[i]:
                raise RuntimeError(
                    "gocoll DistributedGradients: the gradient of parameter %d was produced twice "
                    "before synchronize(); call synchronize() (or optimizer.step() through "
                    "DistributedOptimizer) once per backward, or accumulate inside no_sync()" % i)
            self._fill(p, slot)
            self._ready[i] = True
            b.pending -= 1
            self._launch_ready()

    @staticmethod
    def _fill(p, slot):
        g = p.grad
        if g is None:
            slot.zero_()
            return
        # Before data_ptr(), which a sparse tensor does not have.
        if g.layout is not torch.strided:
            raise errors.InvalidArgument(
                "DistributedGradients: sparse gradients are not supported (a parameter's gradient "
                "is %s, e.g. from nn.Embedding(sparse=True)); use dense gradients" % g.layout)
        if g.data_ptr() != slot.data_ptr():
            slot.copy_(g)

    def _launch_ready(self):
        # with self._lock held: start complete buckets, in bucket order only
        while self._next < len(self._buckets) and self._buckets[self._next].pending == 0:
            self._launch(self._buckets[self._next])
            self._next += 1

    def _launch(self, b):
        b.work = self.comm.all_reduce(b.buffer, op=self.op, async_op=True)
        b.launched = True

    # -- per step -----------------------------------------------------------

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside accumulate gradients locally only; the next
        backward outside (then synchronize) averages the sum."""
        old = self._enabled
        self._enabled = False
        try:
            yield
        finally:
            self._enabled = old

    def synchronize(self):
        """Start the buckets that are still incomplete, wait for every
        bucket, and leave the averaged gradients in ``p.grad``. Call once per
        step on every rank, after backward and before ``optimizer.step()``."""
        with self._lock:
            for b in self._buckets[self._next:]:
                for i in b.params:
                    if not self._ready[i]:
                        self._fill(self._params[i], self._where[i][1])
                b.pending = 0
            self._launch_ready()
            used_work = None
            if self.find_unused_parameters:
                self._used = torch.tensor(self._ready, dtype=torch.uint8)
                used_work = self.comm.all_reduce(self._used, op="max", async_op=True)
            ready = self._ready
            self._ready = [False] * len(self._params)
            self._next = 0
            buckets = self._buckets
            for b in buckets:
                b.pending = len(b.params)
        first_error = None
        for b in buckets:
            try:
                b.work.wait()
            except Exception as e:  # wait for every bucket before raising
                first_error = first_error or e
            b.work = None
            b.launched = False
        if used_work is not None:
            try:
                used_work.wait()
            except Exception as e:
                first_error = first_error or e
        if first_error is not None:
            raise first_error
        self._unpack(ready)

    @torch.no_grad()
    def _unpack(self, ready):
        used = self._used.tolist() if self.find_unused_parameters else None
        for i, p in enumerate(self._params):
            b, slot = self._where[i]
            if used is not None and not used[i]:
                continue  # no rank produced a gradient: leave .grad as it was
            g = p.grad
            if g is not None and g.data_ptr() == slot.data_ptr():
                continue
            if self.gradient_as_bucket_view and (g is None or (g.shape == slot.shape
                                                               and g.dtype == slot.dtype)):
                p.grad = slot
            elif g is None:
                p.grad = slot.clone()
            else:
                g.copy_(slot)

    def step(self, optimizer, *args, **kwargs):
        """``synchronize()`` then ``optimizer.step(...)``."""
        self.synchronize()
        return optimizer.step(*args, **kwargs)

    def remove(self):
        """Unregister the hooks (gradients stay where they are)."""
        for h in self._handles:
            h.remove()
        self._handles = []
        self._grad_accs = []

    def __repr__(self):
        return "<gocoll.torch.DistributedGradients %d params in %d buckets on %r>" % (
            len(self._params), len(self._buckets), self.comm)


class DistributedOptimizer:
    """Wraps an optimizer so that ``step()`` first calls
    ``grads.synchronize()``; every other attribute is the optimizer's::

        dg = DistributedGradients(model, comm)
        opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), dg)
        loss.backward(); opt.step(); opt.zero_grad()
    """

    def __init__(self, optimizer, grads):
        self.__dict__["optimizer"] = optimizer
        self.__dict__["grads"] = grads

    def step(self, *args, **kwargs):
        self.grads.synchronize()
        return self.optimizer.step(*args, **kwargs)

    def zero_grad(self, *args, **kwargs):
        return self.optimizer.zero_grad(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.optimizer, name)

    def __setattr__(self, name, value):
        setattr(self.optimizer, name, value)

    def __repr__(self):
        return "DistributedOptimizer(%r)" % (self.optimizer,)


# ---------------------------------------------------------------------------
# The torch.distributed backend: importing this module registers "gocoll", so
# that dist.init_process_group("gocoll") and new_group(backend="gocoll") work.

from ._backend import Options, ProcessGroupGocoll  # noqa: E402
from ._backend import register as _register_backend  # noqa: E402

_register_backend()
__all__ += ["Options", "ProcessGroupGocoll"]


def monitored_barrier(group=None, timeout=None, wait_all_ranks=False):
    """``torch.distributed.monitored_barrier`` for every backend: torch's
    (1.13 and 2.6) accepts gloo groups only, so this calls a gocoll group's own
    :meth:`ProcessGroupGocoll.monitored_barrier` (rank 0 raises
    :class:`gocoll.Timeout` naming the ranks that did not arrive within
    ``timeout``) and hands other groups to torch."""
    import torch.distributed as dist
    pg = dist.distributed_c10d._get_default_group() if group is None else group
    if isinstance(pg, ProcessGroupGocoll):
        return pg.monitored_barrier(timeout, wait_all_ranks)
    return dist.monitored_barrier(group=group, timeout=timeout, wait_all_ranks=wait_all_ranks)


__all__.append("monitored_barrier")


def split_group(parent_pg=None, split_ranks=None, timeout=None, pg_options=None, group_desc=None):
    """``torch.distributed.split_group`` for gocoll groups: torch 2.5+'s
    refuses every group not bound to a CUDA device (gloo's too), so this
    makes the same groups with ``new_group``. Every rank of ``parent_pg``
    (default: the default group) calls it with the same ``split_ranks``, a
    list of disjoint lists of ``parent_pg``'s group ranks; each rank gets
    the group it is in, or None.

    With the default group as parent every split is a ``new_group`` that
    all ranks make in turn (torch 1.13 and 2.x); with a subgroup as parent,
    each rank makes its own split only (``use_local_synchronization``,
    torch 2.1+), so a split of the same global ranks can be made once."""
    import torch.distributed as dist
    c10d = dist.distributed_c10d
    default = c10d._get_default_group()
    parent = default if parent_pg is None else parent_pg
    if not split_ranks:
        raise ValueError("gocoll.torch.split_group: split_ranks must list the groups' ranks")
    to_global = {g: q for q, g in c10d._world.pg_group_ranks[parent].items()}
    me = dist.get_rank()
    seen, splits = set(), []
    for ranks in split_ranks:
        ranks = sorted(ranks)
        if not ranks or len(set(ranks)) != len(ranks) or seen.intersection(ranks):
            raise ValueError("gocoll.torch.split_group: each split must be a non-empty list of "
                             "distinct ranks, in no other split: %r" % (split_ranks,))
        missing = [q for q in ranks if q not in to_global]
        if missing:
            raise ValueError("gocoll.torch.split_group: ranks %s are not in the parent group (size "
                             "%d)" % (missing, parent.size()))
        seen.update(ranks)
        splits.append([to_global[q] for q in ranks])
    kwargs = {"timeout": timeout, "pg_options": pg_options}
    if group_desc is not None:
        kwargs["group_desc"] = group_desc
    if parent is default:
        mine = None
        for ranks in splits:
            g = dist.new_group(ranks, **kwargs)
            if me in ranks:
                mine = g
        return mine
    if "use_local_synchronization" not in inspect.signature(dist.new_group).parameters:
        raise NotImplementedError("gocoll.torch.split_group of a subgroup needs torch 2.1+ "
                                  "(new_group's use_local_synchronization); split the default "
                                  "group, or call new_group on every rank")
    for ranks in splits:
        if me in ranks:
            return dist.new_group(ranks, use_local_synchronization=True, **kwargs)
    return None


__all__.append("split_group")
