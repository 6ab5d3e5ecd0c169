"""The `data.pkl` of a torch.save archive, read without executing it.

`torch.load(weights_only=True)` (torch/_weights_only_unpickler.py, torch 2.13) runs its own
small unpickler: a fixed set of opcodes, GLOBALs only from an allow-list, and persistent ids
only of the form ('storage', <storage class>, '<key>', '<location>', numel). We walk the
opcodes with `pickletools.genops` (which parses, never imports or calls) through a symbolic
stack of the same opcodes, so the result is inert data: the storages the pickle names
(`data/<key>` records of numel elements of the class's dtype) and the tensors built on them
(`torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...)`, or `_v3` with an
explicit dtype for the dtypes without a typed storage class, on an `UntypedStorage` counted in
bytes). Anything else that torch would refuse is a reason; so is anything malformed.

SpecForge itself loads with weights_only=False, which accepts more; a sample dict of tensors
never needs more than this subset.
"""

from __future__ import annotations

import pickletools
from dataclasses import dataclass, field

# Opcodes torch 2.13's weights-only unpickler handles (Unpickler.load); anything else is
# "Unsupported operand". Protocol 2 (torch.save's default) needs no other.
ALLOWED_OPCODES = frozenset({
    "GLOBAL", "NEWOBJ", "REDUCE", "BUILD", "APPEND", "APPENDS", "SETITEM", "SETITEMS", "MARK", "TUPLE",
    "TUPLE1", "TUPLE2", "TUPLE3", "NONE", "NEWFALSE", "NEWTRUE", "EMPTY_TUPLE", "EMPTY_LIST", "EMPTY_DICT",
    "EMPTY_SET", "BININT", "BININT1", "BININT2", "BINFLOAT", "BINUNICODE", "SHORT_BINSTRING", "BINPERSID",
    "BINGET", "LONG_BINGET", "BINPUT", "LONG_BINPUT", "LONG1", "PROTO", "STOP",
})

# The typed storage classes torch.save names (torch.storage._dtype_to_storage_type_map):
# class name -> (bytes per element, floating point).
STORAGE_CLASSES: dict[str, tuple[int, bool]] = {
    "BFloat16Storage": (2, True), "HalfStorage": (2, True), "FloatStorage": (4, True),
    "DoubleStorage": (8, True), "BoolStorage": (1, False), "ByteStorage": (1, False), "CharStorage": (1, False),
    "ShortStorage": (2, False), "IntStorage": (4, False), "LongStorage": (8, False),
    "ComplexFloatStorage": (8, False), "ComplexDoubleStorage": (16, False), "QInt32Storage": (4, False),
    "QInt8Storage": (1, False), "QUInt8Storage": (1, False), "QUInt2x4Storage": (1, False),
    "QUInt4x2Storage": (1, False),
}
# dtypes named as GLOBALs (torch.<dtype>, for _rebuild_tensor_v3): name -> (itemsize, floating point).
DTYPES: dict[str, tuple[int, bool]] = {
    "bfloat16": (2, True), "float16": (2, True), "float32": (4, True), "float64": (8, True),
    "float8_e4m3fn": (1, True), "float8_e4m3fnuz": (1, True), "float8_e5m2": (1, True),
    "float8_e5m2fnuz": (1, True), "float8_e8m0fnu": (1, True), "float4_e2m1fn_x2": (1, True),
    "bool": (1, False), "uint8": (1, False), "int8": (1, False), "int16": (2, False), "int32": (4, False),
    "int64": (8, False), "uint16": (2, False), "uint32": (4, False), "uint64": (8, False),
    "complex32": (4, False), "complex64": (8, False), "complex128": (16, False),
    "bits8": (1, False), "bits16": (2, False), "bits1x8": (1, False), "bits2x4": (1, False), "bits4x2": (1, False),
    "qint8": (1, False), "qint32": (4, False), "quint8": (1, False), "quint2x4": (1, False), "quint4x2": (1, False),
    **{f"{k}{n}": (1, False) for k in ("int", "uint") for n in range(1, 8)},
}
_TENSOR_TYPES = ("BFloat16", "Bool", "Byte", "Char", "Double", "Float", "Half", "Int", "Long", "Short")
# torch 2.13's _get_allowed_globals() (144 names), and the one name torch 1.13 allowed that 2.13
# dropped (tests/test_extractions_torch.py holds this list against both torches' own).
ALLOWED_GLOBALS = frozenset(
    [f"torch.{c}" for c in STORAGE_CLASSES]
    + [f"torch.cuda.{c}" for c in STORAGE_CLASSES if not c.startswith("Q")]
    + [f"torch.{t}Tensor" for t in _TENSOR_TYPES]
    + [f"torch.cuda.{t}Tensor" for t in _TENSOR_TYPES]
    + [f"torch.{p}sparse.{t}Tensor" for p in ("", "cuda.") for t in _TENSOR_TYPES if t != "Bool"]
    + [f"torch.{d}" for d in DTYPES]
    + [f"torch._utils._rebuild_{f}" for f in (
        "tensor", "tensor_v2", "tensor_v3", "parameter", "parameter_with_state", "qtensor", "sparse_tensor",
        "nested_tensor", "meta_tensor_no_storage", "wrapper_subclass", "device_tensor_from_cpu_tensor",
        "device_tensor_from_numpy")]
    + ["torch._tensor._rebuild_from_type_v2", "torch.serialization._get_layout", "torch.Size", "torch.Tensor",
       "torch.device", "torch.storage.TypedStorage", "torch.storage.UntypedStorage",
       "torch.nn.parameter.Parameter", "collections.OrderedDict", "collections.Counter", "builtins.set",
       "builtins.bytearray", "builtins.complex", "_codecs.encode", "torch._utils._rebuild_sparse_csr_tensor"]
    + [f"torch.{q}" for q in ("per_tensor_affine", "per_channel_affine", "per_channel_affine_float_qparams",
                               "per_tensor_symmetric", "per_channel_symmetric")]
)

# torch.load's restore_location accepts a storage's location only for a known device type
# (torch/serialization.py _package_registry and the backends registered with it).
DEVICES = ("cpu", "cuda", "mps", "meta", "xpu", "hpu", "mtia", "xla", "lazy", "ipu", "maia", "privateuseone")
MAX_OPS = 1_000_000  # a sample dict has ~100; a pickle this long is not a sample


class PickleDamage(Exception):
    """The pickle is malformed, or torch.load would refuse it."""


@dataclass(frozen=True)
class Global:
    name: str  # "module.name"


@dataclass
class Obj:
    """The result of calling a GLOBAL (REDUCE, NEWOBJ), with the state BUILD gave it."""
    func: str
    args: tuple
    items: list = field(default_factory=list)  # SETITEM(S) on an OrderedDict


@dataclass(frozen=True)
class Storage:
    key: str
    cls: str  # "BFloat16Storage", "UntypedStorage"
    numel: int  # elements of the class's dtype (bytes for UntypedStorage)
    location: str

    @property
    def nbytes(self) -> int:
        return self.numel * (STORAGE_CLASSES[self.cls][0] if self.cls in STORAGE_CLASSES else 1)


@dataclass(frozen=True)
class TensorRef:
    name: str  # the dict key it was stored under ("hidden_state"), or "" when not at the top level
    storage: str  # its storage's key
    itemsize: int
    floating: bool
    offset: int  # elements
    size: tuple[int, ...]
    stride: tuple[int, ...]

    def extent_bytes(self) -> int:
        """Bytes of the storage the tensor reaches into, from its start (torch's
        checkInBoundsForStorage): 0 for an empty tensor."""
        if any(s == 0 for s in self.size):
            return 0
        last = self.offset + sum((s - 1) * st for s, st in zip(self.size, self.stride, strict=True))
        return (last + 1) * self.itemsize


@dataclass
class PickleInfo:
    storages: dict[str, Storage]
    tensors: list[TensorRef]
    protocol: int


class _Dict(list):
    """An EMPTY_DICT: its items as a list of pairs (keys may be unhashable symbols)."""


def read_pickle(data: bytes) -> PickleInfo:
    """Walk `data` (a data.pkl) as torch.load(weights_only=True) would, without executing it.
    Raises PickleDamage with the reason."""
    stack: list = []
    marks: list[list] = []
    memo: dict[int, object] = {}
    storages: dict[str, Storage] = {}
    tensors: list[Obj] = []
    protocol = 0

    def pop() -> object:
        if not stack:
            raise PickleDamage("data.pkl: stack underflow")
        return stack.pop()

    def pop_mark() -> list:
        nonlocal stack
        if not marks:
            raise PickleDamage("data.pkl: no MARK to pop to")
        items, stack = stack, marks.pop()
        return items

    try:
        ops = pickletools.genops(data)
        for n, (op, arg, pos) in enumerate(ops):
            name = op.name
            if n > MAX_OPS:
                raise PickleDamage("data.pkl: too many opcodes for a sample")
            if name not in ALLOWED_OPCODES:
                raise PickleDamage(f"data.pkl: opcode {name} at byte {pos}, which torch.load(weights_only=True) "
                                   "does not allow")
            if name == "PROTO":
                protocol = arg
            elif name == "STOP":
                result = pop()
                break
            elif name == "GLOBAL":
                full = arg.replace(" ", ".", 1)
                if full not in ALLOWED_GLOBALS:
                    raise PickleDamage(f"data.pkl: GLOBAL {full!r}, which torch.load(weights_only=True) does "
                                       "not allow")
                stack.append(Global(full))
            elif name == "MARK":
                marks.append(stack)
                stack = []
            elif name in ("BININT", "BININT1", "BININT2", "LONG1", "BINFLOAT", "BINUNICODE", "SHORT_BINSTRING"):
                stack.append(arg)
            elif name == "NONE":
                stack.append(None)
            elif name in ("NEWTRUE", "NEWFALSE"):
                stack.append(name == "NEWTRUE")
            elif name == "EMPTY_TUPLE":
                stack.append(())
            elif name == "EMPTY_LIST":
                stack.append([])
            elif name == "EMPTY_DICT":
                stack.append(_Dict())
            elif name == "EMPTY_SET":
                stack.append(set())
            elif name == "TUPLE":
                items = tuple(pop_mark())  # first: pop_mark rebinds `stack`
                stack.append(items)
            elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
                k = int(name[-1])
                if len(stack) < k:
                    raise PickleDamage("data.pkl: stack underflow")
                items = tuple(stack[-k:])
                del stack[-k:]
                stack.append(items)
            elif name in ("BINPUT", "LONG_BINPUT"):
                if not stack:
                    raise PickleDamage("data.pkl: stack underflow")
                memo[arg] = stack[-1]
            elif name in ("BINGET", "LONG_BINGET"):
                if arg not in memo:
                    raise PickleDamage(f"data.pkl: memo {arg} read before it was written")
                stack.append(memo[arg])
            elif name == "BINPERSID":
                stack.append(_storage(pop(), storages))
            elif name in ("REDUCE", "NEWOBJ"):
                args, func = pop(), pop()
                if not isinstance(func, Global) or not isinstance(args, tuple):
                    raise PickleDamage(f"data.pkl: {name} of something that is not an allowed global")
                obj = Obj(func.name, args)
                if func.name in ("torch._utils._rebuild_tensor_v2", "torch._utils._rebuild_tensor",
                                 "torch._utils._rebuild_tensor_v3"):
                    tensors.append(obj)
                stack.append(obj)
            elif name == "BUILD":
                pop()  # the state; torch sets it on the object below
                if not stack:
                    raise PickleDamage("data.pkl: stack underflow")
            elif name in ("SETITEM", "SETITEMS"):
                items = pop_mark() if name == "SETITEMS" else [pop(), pop()][::-1]
                if len(items) % 2:
                    raise PickleDamage("data.pkl: SETITEMS with an odd number of items")
                if not stack or not isinstance(stack[-1], (_Dict, Obj)):
                    raise PickleDamage(f"data.pkl: {name} on something that is not a dict")
                target = stack[-1]
                pairs = list(zip(items[::2], items[1::2], strict=True))
                (target if isinstance(target, _Dict) else target.items).extend(pairs)
            elif name in ("APPEND", "APPENDS"):
                items = pop_mark() if name == "APPENDS" else [pop()]
                if not stack or not isinstance(stack[-1], list) or isinstance(stack[-1], _Dict):
                    raise PickleDamage(f"data.pkl: {name} on something that is not a list")
                stack[-1].extend(items)
        else:
            raise PickleDamage("data.pkl: ends before its STOP opcode")
    except PickleDamage:
        raise
    except (ValueError, TypeError, UnicodeDecodeError, IndexError, KeyError, OverflowError) as exc:
        # pickletools' own errors: an unknown opcode, an argument cut off, bad UTF-8, ...
        raise PickleDamage(f"data.pkl: {exc}") from None
    names = {}
    if isinstance(result, _Dict):
        names = {id(v): k for k, v in result if isinstance(k, str) and isinstance(v, Obj)}
    refs = [_tensor(obj, names.get(id(obj), "")) for obj in tensors]
    return PickleInfo(storages, refs, protocol)


def _storage(pid: object, storages: dict[str, Storage]) -> Storage:
    """A persistent id, as torch's persistent_load reads it."""
    if not isinstance(pid, tuple) or len(pid) != 5 or pid[0] != "storage":
        raise PickleDamage(f"data.pkl: persistent id {pid!r:.80} is not ('storage', class, key, location, numel)")
    _, cls, key, location, numel = pid
    if not isinstance(cls, Global) or not (cls.name.startswith("torch.") and cls.name.endswith("Storage")):
        raise PickleDamage(f"data.pkl: storage class {cls!r:.60} is not a torch storage class")
    short = cls.name.rsplit(".", 1)[1]
    if short not in STORAGE_CLASSES and short != "UntypedStorage":
        raise PickleDamage(f"data.pkl: storage class {cls.name} is not a torch storage class")
    if not isinstance(key, str) or not isinstance(location, str) or type(numel) is not int or numel < 0:
        raise PickleDamage(f"data.pkl: storage {key!r:.40} has a bad key, location or size")
    device, _, index = location.partition(":")
    if device not in DEVICES or (index and not index.isdigit()):
        raise PickleDamage(f"data.pkl: storage {key} is on device {location!r:.20}, which torch.load cannot restore")
    s = Storage(key, short, numel, location)
    if storages.setdefault(key, s) != s:
        raise PickleDamage(f"data.pkl: storage {key} named twice with different sizes or types")
    return s


def _tensor(obj: Obj, name: str) -> TensorRef:
    args = obj.args
    if len(args) < 4 or not isinstance(args[0], Storage):
        raise PickleDamage(f"data.pkl: tensor {name!r} is not built on a storage")
    storage, offset, size, stride = args[:4]
    if obj.func.endswith("_v3"):
        dtype = args[6].name.removeprefix("torch.") if len(args) > 6 and isinstance(args[6], Global) else ""
        if dtype not in DTYPES:
            raise PickleDamage(f"data.pkl: tensor {name!r} has no known dtype")
        itemsize, floating = DTYPES[dtype]
    elif storage.cls in STORAGE_CLASSES:
        itemsize, floating = STORAGE_CLASSES[storage.cls]
    else:
        itemsize, floating = 1, False
    ints = (type(offset) is int and isinstance(size, tuple) and isinstance(stride, tuple)
            and all(type(x) is int for x in size + stride))
    if not ints or len(size) != len(stride) or offset < 0 or any(x < 0 for x in size + stride):
        raise PickleDamage(f"data.pkl: tensor {name!r} has a bad offset, size or stride")
    ref = TensorRef(name, storage.key, itemsize, floating, offset, size, stride)
    if ref.extent_bytes() > storage.nbytes:
        raise PickleDamage(f"data.pkl: tensor {name!r} reaches byte {ref.extent_bytes()} of its storage "
                           f"data/{storage.key}, which has {storage.nbytes}")
    return ref
