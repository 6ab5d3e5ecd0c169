"""The ABI check of tests/test_fakenvml_abi.py: what pynvml passes to libnvidia-ml for the calls reconcile
makes, against the prototypes and structs of NVIDIA's nvml.h (tests/nvml_header.py).

Two halves, each from its authority at test time:
- pynvml's side is recorded, not read: `python3 tests/nvml_abi.py record OUT.json` (run with the fake
  driver on LD_LIBRARY_PATH) wraps pynvml's `_nvmlGetFunctionPointer`, runs reconcile's own NVML code
  (the observation with every setting declared, each setter), and writes, per C function, the ctypes
  type of every argument pynvml passed (by value or through a pointer, with each struct's field offsets
  and sizes as ctypes lays them out, and the `version` it put in a versioned struct), the return type,
  and which pynvml functions were called;
- the header's side is compiled: a C++ probe (`header_facts`) includes nvml.h and prints, for those
  functions, every parameter's size, whether it is a pointer and the size of what it points to
  (std::tuple of the prototype's parameter types, so nothing is parsed by hand), each struct's sizeof
  and offsetof/sizeof of the fields pynvml names, whether the parameter is that very struct, the
  version macros (NVML_STRUCT_VERSION) and any constant asked for.
`compare` says where they differ, one line each.
"""

from __future__ import annotations

import ctypes
import io
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

# --- pynvml's side ------------------------------------------------------------------------------


def _ctype_name(t: type) -> str:
    return t.__name__


def _layout(t: type) -> dict[str, Any]:
    """A ctypes Structure/Union's size and its fields' (offset, size), nested ones too."""
    fields = {}
    nested = {}
    for name, ftype, *_ in t._fields_:
        desc = getattr(t, name)
        fields[name] = [desc.offset, desc.size]
        if issubclass(ftype, (ctypes.Structure, ctypes.Union)):
            nested[name] = {"type": _ctype_name(ftype), **_layout(ftype)}
    return {"size": ctypes.sizeof(t), "union": issubclass(t, ctypes.Union), "fields": fields, "nested": nested}


def _pointee(t: type, sample: Any) -> dict[str, Any]:
    d: dict[str, Any] = {"kind": "pointer", "ctype": _ctype_name(t), "size": ctypes.sizeof(t),
                         "pointer": issubclass(t, ctypes._Pointer)}
    if issubclass(t, (ctypes.Structure, ctypes.Union)):
        d["layout"] = _layout(t)
        if "version" in d["layout"]["fields"] and sample is not None:
            d["version"] = int(sample.version)
    return d


def describe(arg: Any) -> dict[str, Any]:
    """How ctypes passes ARG: its C type, by value or through a pointer (ctypes' own conversions: a
    Python int is a C int, bytes a char *)."""
    if arg is None:
        return {"kind": "null"}
    if isinstance(arg, (bool, int)):
        return {"kind": "value", "ctype": "c_int (a Python int)", "size": ctypes.sizeof(ctypes.c_int)}
    if isinstance(arg, bytes):
        return {"kind": "pointer", "ctype": "c_char (bytes)", "size": 1, "pointer": False}
    if type(arg).__name__ == "CArgObject":  # byref(x)
        obj = arg._obj
        if isinstance(obj, ctypes.Array):
            return _pointee(type(obj)._type_, obj[0] if len(obj) else None)
        return _pointee(type(obj), obj)
    if isinstance(arg, ctypes.Array):  # an array passed as is: a pointer to its first element
        return _pointee(type(arg)._type_, arg[0] if len(arg) else None)
    if isinstance(arg, ctypes._Pointer):  # a handle (c_nvmlDevice_t), by value
        return {"kind": "value", "ctype": _ctype_name(type(arg)), "size": ctypes.sizeof(type(arg)), "pointer": True}
    if isinstance(arg, ctypes._SimpleCData):
        return {"kind": "value", "ctype": _ctype_name(type(arg)), "size": ctypes.sizeof(type(arg)),
                "pointer": type(arg).__name__ in ("c_char_p", "c_void_p", "c_wchar_p")}
    if isinstance(arg, (ctypes.Structure, ctypes.Union)):
        return {"kind": "struct value", "ctype": _ctype_name(type(arg)), "size": ctypes.sizeof(type(arg)),
                "layout": _layout(type(arg))}
    return {"kind": "unknown", "ctype": type(arg).__name__}


class Recorder:
    """Wraps pynvml._nvmlGetFunctionPointer: every call into the library is described before it is made."""

    def __init__(self, pynvml: Any):
        self.nv = pynvml
        self.calls: dict[str, dict[str, Any]] = {}
        self.wrappers: set[str] = set()
        original = pynvml._nvmlGetFunctionPointer
        recorder = self

        class Recorded:
            def __init__(self, name: str, fn: Any):
                object.__setattr__(self, "_name", name)
                object.__setattr__(self, "_fn", fn)

            def __getattr__(self, key: str) -> Any:
                return getattr(self._fn, key)

            def __setattr__(self, key: str, value: Any) -> None:  # pynvml sets restype (nvmlErrorString)
                setattr(self._fn, key, value)

            def __call__(self, *args: Any) -> Any:
                recorder.note(self._name, args, self._fn.restype)
                return self._fn(*args)

        pynvml._nvmlGetFunctionPointer = lambda name: Recorded(name, original(name))

    def note(self, name: str, args: tuple, restype: Any) -> None:
        frame = sys._getframe(2)
        while frame is not None:
            if frame.f_globals is vars(self.nv) and frame.f_code.co_name.startswith("nvml"):
                self.wrappers.add(frame.f_code.co_name)
            frame = frame.f_back
        entry = self.calls.setdefault(name, {"params": [], "restype": None, "wrappers": []})
        entry["restype"] = {"ctype": restype.__name__ if restype else "None",
                            "size": ctypes.sizeof(restype) if restype else 0,
                            "pointer": restype is not None and restype.__name__ in ("c_char_p", "c_void_p")}
        for i, arg in enumerate(args):
            seen = describe(arg)
            if i == len(entry["params"]):
                entry["params"].append([])
            if seen not in entry["params"][i]:
                entry["params"][i].append(seen)


ALL_SETTINGS = ("power_limit", "compute_mode", "application_clocks", "locked_clocks", "mig", "ecc")
SETTER_VALUES = (("persistence_mode", True), ("power_limit", 300000), ("compute_mode", "exclusive_process"),
                 ("application_clocks", (14001, 1590)), ("application_clocks", "default"),
                 ("locked_clocks", (210, 1500)), ("locked_clocks", "none"), ("mig", True), ("ecc", False))


def record_main(out: Path) -> None:
    """In a process whose LD_LIBRARY_PATH holds the fake: reconcile's observation (every setting
    declared) and every setter, recorded; then any pynvml function reconcile names that those did not
    reach (a fallback no driver this fake models needs), called as reconcile calls it: with a handle or
    nothing ("direct" in the output)."""
    import pynvml
    from reconcile_host.reconcilers.gpus.nvml import nvml_observe
    from reconcile_host.reconcilers.gpus.nvml_settings import setter_child

    rec = Recorder(pynvml)
    reading = nvml_observe(ALL_SETTINGS)
    for setting, value in SETTER_VALUES:
        setter_child({"uuid": reading.gpus[0].uuid, "gpu": 0, "setting": setting, "value": value}, io.BytesIO())
    by_code = sorted(rec.calls)  # the library's functions reconcile's own code called
    funcs, _ = referenced(HERE.parent, pynvml)
    direct = []
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    for name in sorted(funcs - rec.wrappers):
        fn = getattr(pynvml, name)
        for args in ((), (handle,)):
            try:
                fn(*args)
            except TypeError:
                continue  # not this many arguments
            except pynvml.NVMLError:
                pass  # the call was made, and described
            direct.append(name)
            break
    pynvml.nvmlShutdown()
    with out.open("w") as f:
        json.dump({"calls": rec.calls, "wrappers": sorted(rec.wrappers), "direct": direct, "by_code": by_code,
                   "pynvml": getattr(pynvml, "__file__", "?")}, f, indent=1, sort_keys=True)


# --- which pynvml names reconcile uses -------------------------------------------------------------

# reconcile's NVML code and the hardware suite's own NVML calls (tests/hardware/fake_smi.py is a stand-in
# nvidia-smi that only ever runs on the fake: not among them).
SOURCES = ("reconcilers/gpus/nvml.py", "reconcilers/gpus/nvml_settings.py", "reconcilers/gpus/setters.py",
           "tests/hardware/hwsuite.py", "tests/hardware/observe.py")


def referenced(root: Path, pynvml: Any) -> tuple[set[str], set[str]]:
    """(pynvml functions, pynvml constants) the code names: attributes and whole-string constants
    (getattr(nv, NAME) tables), f-string name patterns matched against pynvml's own names."""
    import ast

    names: set[str] = set()
    for rel in SOURCES:
        src = root / rel
        if not src.exists():
            continue
        for node in ast.walk(ast.parse(src.read_text())):
            if isinstance(node, ast.Attribute) and re.fullmatch(r"(nvml|NVML_)\w+", node.attr):
                names.add(node.attr)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                names.update(re.findall(r"\b(?:n|nv|pynvml)\.(nvml\w+)\(", node.value))  # code in strings
                if re.fullmatch(r"nvml[A-Z]\w+", node.value):
                    names.add(node.value)
            elif isinstance(node, ast.JoinedStr):
                # a placeholder is one capitalised word ("Compute"), or a suffix ("_v3")
                pattern = "".join(re.escape(v.value) if isinstance(v, ast.Constant) else r"(?:[A-Z][a-z]+|_v\d+)"
                                  for v in node.values)
                if pattern.startswith("nvml"):
                    names.update(n for n in vars(pynvml) if re.fullmatch(pattern, n))
    funcs = {n for n in names if callable(getattr(pynvml, n, None)) and not isinstance(getattr(pynvml, n), type)}
    consts = {n for n in names if isinstance(getattr(pynvml, n, None), int)}
    return funcs, consts


# --- the header's side ----------------------------------------------------------------------------

PROBE_HEAD = r"""
#define NVML_NO_UNVERSIONED_FUNC_DEFS
#include <nvml.h>
#include <cstddef>
#include <cstdio>
#include <tuple>
#include <type_traits>

template <class T, class = void> struct complete : std::false_type {};
template <class T> struct complete<T, decltype(void(sizeof(T)))> : std::true_type {};

template <class T> void param(bool &first) {
    std::printf("%s{\"size\":%zu,\"pointer\":%s", first ? "" : ",", sizeof(T),
                std::is_pointer<T>::value ? "true" : "false");
    if constexpr (std::is_pointer<T>::value) {
        using P = std::remove_cv_t<std::remove_pointer_t<T>>;
        if constexpr (std::is_void<P>::value) std::printf(",\"pointee\":\"void\"");
        else if constexpr (complete<P>::value)
            std::printf(",\"pointee_size\":%zu,\"pointee_pointer\":%s", sizeof(P),
                        std::is_pointer<P>::value ? "true" : "false");
        else std::printf(",\"pointee\":\"opaque\"");
    }
    std::printf("}");
    first = false;
}

// Types only (decltype(&f)): nothing is called or linked.
template <class F> struct proto;
template <class R, class... A> struct proto<R (*)(A...)> {
    static void describe(const char *name) {
        std::printf("\"%s\":{\"return\":{\"size\":%zu,\"pointer\":%s},\"params\":[", name, sizeof(R),
                    std::is_pointer<R>::value ? "true" : "false");
        bool first = true;
        (param<A>(first), ...);
        std::printf("]},\n");
    }
    template <std::size_t I>
    using pointee = std::remove_cv_t<std::remove_pointer_t<std::tuple_element_t<I, std::tuple<A...>>>>;
};
"""


def _struct_args(recorded: dict[str, Any]) -> list[tuple[str, int, dict[str, Any]]]:
    """(function, parameter index, pointer description) of every struct or union pynvml passed."""
    return [(name, i, d) for name, entry in sorted(recorded.items()) for i, seen in enumerate(entry["params"])
            for d in seen if "layout" in d]


def _layouts(layout: dict[str, Any], key: str, ctype: str) -> list[tuple[str, str, dict[str, Any]]]:
    """(key, C++ type expression suffix, layout) of a struct and of the structs nested in it."""
    out = [(key, ctype, layout)]
    for field, sub in layout["nested"].items():
        out += _layouts(sub, f"{key}.{field}", f"std::remove_cv_t<decltype({ctype}::{field})>")
    return out


def probe_source(recorded: dict[str, Any], constants: list[str]) -> str:
    """The C++ probe: nvml.h's side of every recorded call. A struct is compared with the type the
    prototype's parameter points to (not by name), so a pynvml class nvml.h does not name is still read."""
    fields = set()
    for _name, _i, d in _struct_args(recorded):
        for _, _, layout in _layouts(d["layout"], "", "T"):
            fields.update(layout["fields"])
    lines = [PROBE_HEAD]
    for f in sorted(fields):
        # offsetof and sizeof of field F where T has it, null where it does not (a field pynvml invents)
        lines.append(f"template <class T, class = void> struct has_{f} : std::false_type {{}};\n"
                     f"template <class T> struct has_{f}<T, std::void_t<decltype(&T::{f})>> : std::true_type {{}};\n"
                     f"template <class T> void field_{f}(const char *name, bool first) {{\n"
                     f"    if constexpr (has_{f}<T>::value)\n"
                     f"        std::printf(\"%s\\\"%s\\\":[%zu,%zu]\", first ? \"\" : \",\", "
                     f"name, offsetof(T, {f}), sizeof(((T *)0)->{f}));\n"
                     f"    else std::printf(\"%s\\\"%s\\\":null\", first ? \"\" : \",\", name);\n}}")
    lines += ["int main() {", '    std::printf("{\\"functions\\":{\\n");']
    for name in sorted(recorded):
        lines.append(f'    proto<decltype(&{name})>::describe("{name}");')
    lines.append('    std::printf("\\"\\":{}},\\n\\"structs\\":{\\n");')
    for name, i, d in _struct_args(recorded):
        lines.append("    {")
        lines.append(f"        using T = proto<decltype(&{name})>::pointee<{i}>;")
        for key, texpr, layout in _layouts(d["layout"], f"{name} {i}", "T"):
            lines.append("        {")
            lines.append(f"            using S = {texpr};")
            lines.append(f'            std::printf("\\"{key}\\":{{\\"size\\":%zu,\\"fields\\":{{", sizeof(S));')
            for n, f in enumerate(layout["fields"]):
                lines.append(f'            field_{f}<S>("{f}", {"true" if n == 0 else "false"});')
            lines.append('            std::printf("}},\\n");')
            lines.append("        }")
        lines.append("    }")
    lines.append('    std::printf("\\"\\":{}},\\n\\"versions\\":{\\n");')
    macros = sorted({d["ctype"][2:-2] if d["ctype"].startswith("c_") else d["ctype"][:-2]
                     for _, _, d in _struct_args(recorded) if "version" in d})
    for macro in macros:  # nvml.h's version macro of the struct pynvml named (nvmlMemory_v2_t: nvmlMemory_v2)
        lines += [f"#ifdef {macro}", f'    std::printf("\\"{macro}\\":%u,\\n", (unsigned)({macro}));', "#endif"]
    lines.append('    std::printf("\\"\\":0},\\n\\"constants\\":{\\n");')
    for c in constants:
        lines.append(f'    std::printf("\\"{c}\\":%lld,\\n", (long long)({c}));')  # a macro or an enum value
    lines.append('    std::printf("\\"\\":0}}\\n");')
    lines.append("    return 0;\n}")
    return "\n".join(lines) + "\n"


def header_facts(include: Path, recorded: dict[str, Any], constants: list[str], workdir: Path) -> dict[str, Any]:
    """Compile and run the probe (g++, C++17) against INCLUDE/nvml.h. Raises CalledProcessError with the
    compiler's words when the header lacks a function, struct, field or macro pynvml uses."""
    gxx = shutil.which("g++") or shutil.which("c++")
    if gxx is None:
        raise FileNotFoundError("g++ not found (the probe reads the prototypes' parameter types with C++ templates)")
    workdir = workdir.resolve()
    src = workdir / "nvml_probe.cpp"
    src.write_text(probe_source(recorded, constants))
    exe = workdir / "nvml_probe"
    proc = subprocess.run([gxx, "-std=c++17", "-w", f"-I{include}", "-o", str(exe), str(src)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, proc.args, proc.stdout, proc.stderr)
    facts = json.loads(subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout)
    for section in facts.values():
        section.pop("", None)
    return facts


# --- the comparison -------------------------------------------------------------------------------


def compare(recorded: dict[str, Any], facts: dict[str, Any]) -> list[str]:
    """One line per difference between what pynvml passed and what nvml.h declares."""
    problems = []
    for name, entry in sorted(recorded.items()):
        proto = facts["functions"][name]
        if len(entry["params"]) != len(proto["params"]):
            problems.append(f"{name}: pynvml passes {len(entry['params'])} arguments, nvml.h takes "
                            f"{len(proto['params'])}")
            continue
        rt = entry["restype"]
        if rt["size"] != proto["return"]["size"] or rt["pointer"] != proto["return"]["pointer"]:
            problems.append(f"{name}: pynvml reads the result as {rt['ctype']} ({rt['size']} bytes), nvml.h returns "
                            f"{proto['return']['size']} bytes{' (a pointer)' if proto['return']['pointer'] else ''}")
        for i, (seen, want) in enumerate(zip(entry["params"], proto["params"], strict=True)):
            for d in seen:
                where = f"{name} argument {i + 1}"
                if d["kind"] == "null":
                    if not want["pointer"]:
                        problems.append(f"{where}: pynvml passes NULL where nvml.h takes a {want['size']}-byte value")
                elif d["kind"] == "value":
                    if d["size"] != want["size"] or d.get("pointer", False) != want["pointer"]:
                        problems.append(f"{where}: pynvml passes {d['ctype']} ({d['size']} bytes) by value, nvml.h "
                                        f"takes {want['size']} bytes{' (a pointer)' if want['pointer'] else ''}")
                elif d["kind"] == "pointer":
                    if not want["pointer"]:
                        problems.append(f"{where}: pynvml passes a pointer to {d['ctype']}, nvml.h takes a "
                                        f"{want['size']}-byte value")
                    elif "pointee_size" in want and (d["size"] != want["pointee_size"]
                                                      or d["pointer"] != want["pointee_pointer"]):
                        problems.append(f"{where}: pynvml points at {d['ctype']} ({d['size']} bytes), nvml.h's "
                                        f"pointee is {want['pointee_size']} bytes")
                    if "version" in d:
                        macro = d["ctype"][2:-2] if d["ctype"].startswith("c_") else d["ctype"][:-2]
                        if macro not in facts["versions"]:
                            problems.append(f"{where}: pynvml sets version {d['version']:#x} in {d['ctype']}; "
                                            f"nvml.h has no {macro}")
                        elif d["version"] != facts["versions"][macro]:
                            problems.append(f"{where}: pynvml sets {d['ctype']}.version to {d['version']:#x}, "
                                            f"nvml.h's {macro} is {facts['versions'][macro]:#x}")
                else:
                    problems.append(f"{where}: pynvml passes {d['kind']} {d.get('ctype')}: this check cannot read it")
    for name, i, d in _struct_args(recorded):
        for key, _, layout in _layouts(d["layout"], f"{name} {i}", "T"):
            header = facts["structs"][key]
            what = f"{name} argument {i + 1} ({d['ctype']}{key[len(f'{name} {i}'):]})"
            if layout["size"] != header["size"]:
                problems.append(f"{what}: pynvml's ctypes size {layout['size']}, nvml.h's sizeof {header['size']}")
            for field, (off, size) in layout["fields"].items():
                if header["fields"][field] is None:
                    problems.append(f"{what}.{field}: pynvml has the field (offset {off} size {size}), nvml.h's "
                                    "struct has none")
                elif [off, size] != header["fields"][field]:
                    problems.append(f"{what}.{field}: pynvml at offset {off} size {size}, nvml.h at offset "
                                    f"{header['fields'][field][0]} size {header['fields'][field][1]}")
    return problems


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "record":
        record_main(Path(sys.argv[2]))
    else:
        sys.exit("usage: nvml_abi.py record OUT.json")
