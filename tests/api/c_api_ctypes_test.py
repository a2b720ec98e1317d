#!/usr/bin/env python3
"""kvq's C API from Python's standard library alone, as an embedder uses it.

Installs the build tree into a temporary prefix, finds libkvq.so there through its pkg-config file,
checks that the library exports exactly the functions kvq.h declares, and through ctypes: loads the
bundled stories260K, generates greedily for each golden prompt (models/stories260K/golden-runc-ids.txt)
and compares the text and ids with `kvq run --json` and with the reference ids, streams the tokens
through a callback, renders a chat, and checks that a missing file and a wrong struct_size are errors
whose text names them.

Usage: c_api_ctypes_test.py BUILD_DIR SOURCE_DIR KVQ_BINARY
"""
import ctypes
import json
import os
import re
import subprocess
import sys
import tempfile

failures = []


def check(ok, what, why=""):
    """Records a check; `why` (the library's last error, say) is printed only when it fails."""
    print(("ok: " if ok else "FAIL: ") + what + ("" if ok or not why else f": {why}"))
    if not ok:
        failures.append(what)


# The structs of kvq.h, field for field (ctypes lays them out as the C compiler does).
class ModelOptions(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("tokenizer_path", ctypes.c_char_p), ("threads", ctypes.c_int32),
                ("context", ctypes.c_int64), ("kv_key_format", ctypes.c_char_p),
                ("kv_value_format", ctypes.c_char_p), ("kv_device_budget_bytes", ctypes.c_int64),
                ("kv_host_budget_bytes", ctypes.c_int64), ("kv_disk_dir", ctypes.c_char_p),
                ("n_kv_layers", ctypes.c_int32), ("kv_layer_key_formats", ctypes.POINTER(ctypes.c_char_p)),
                ("kv_layer_value_formats", ctypes.POINTER(ctypes.c_char_p)),
                ("repack", ctypes.c_int32), ("repack_memory_available", ctypes.c_int64)]


class ModelInfo(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("architecture", ctypes.c_char_p)] + \
        [(n, ctypes.c_int32) for n in ("n_layers", "dim", "hidden_dim", "n_heads", "n_kv_heads", "head_dim",
                                       "vocab_size")] + \
        [("trained_context", ctypes.c_int64), ("context", ctypes.c_int64), ("threads", ctypes.c_int32),
         ("bos", ctypes.c_int32), ("eos", ctypes.c_int32), ("n_attention_layers", ctypes.c_int32),
         ("state_bytes", ctypes.c_int64), ("chat_template", ctypes.c_char_p)]


class GenerateOptions(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("max_tokens", ctypes.c_int32), ("temperature", ctypes.c_float),
                ("top_k", ctypes.c_int32), ("top_p", ctypes.c_float), ("min_p", ctypes.c_float),
                ("seed", ctypes.c_uint64), ("stop", ctypes.POINTER(ctypes.c_char_p)), ("n_stop", ctypes.c_int32),
                ("ignore_eos", ctypes.c_int32), ("grammar", ctypes.c_char_p), ("json_schema", ctypes.c_char_p)]


class ChatMessage(ctypes.Structure):
    _fields_ = [("role", ctypes.c_char_p), ("content", ctypes.c_char_p)]


TOKEN_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int32, ctypes.c_char_p, ctypes.c_void_p)


def bind(lib):
    """Declares the signatures this test calls."""
    P, c = ctypes.POINTER, ctypes
    sigs = {
        "kvq_version": (c.c_char_p, []),
        "kvq_last_error": (c.c_char_p, []),
        "kvq_model_options_init": (None, [P(ModelOptions)]),
        "kvq_model_load": (c.c_void_p, [c.c_char_p, P(ModelOptions)]),
        "kvq_model_free": (None, [c.c_void_p]),
        "kvq_model_info_init": (None, [P(ModelInfo)]),
        "kvq_model_get_info": (c.c_int, [c.c_void_p, P(ModelInfo)]),
        "kvq_tokenize": (c.c_int64, [c.c_void_p, c.c_char_p, c.c_int, P(c.c_int32), c.c_int64]),
        "kvq_session_new": (c.c_void_p, [c.c_void_p, P(ModelOptions)]),
        "kvq_session_free": (None, [c.c_void_p]),
        "kvq_generate_options_init": (None, [P(GenerateOptions)]),
        "kvq_session_generate": (c.c_int, [c.c_void_p, c.c_char_p, P(GenerateOptions), TOKEN_FN, c.c_void_p,
                                           P(c.c_int64)]),
        "kvq_session_finish_reason": (c.c_int, [c.c_void_p]),
        "kvq_apply_chat_template": (c.c_int64, [c.c_void_p, P(ChatMessage), c.c_int64, c.c_void_p, c.c_char_p,
                                                c.c_int64]),
    }
    for name, (restype, argtypes) in sigs.items():
        f = getattr(lib, name)
        f.restype, f.argtypes = restype, argtypes


def golden_prompts(source_dir):
    """(prompt, ids incl. BOS and prompt) per run in golden-runc-ids.txt."""
    runs = []
    with open(os.path.join(source_dir, "models/stories260K/golden-runc-ids.txt"), encoding="utf-8") as f:
        for line in f:
            m = re.match(r'=== model=stories260K\.bin prompt="(.*)" \(token ids', line)
            if m:
                runs.append((m.group(1), []))
            elif line.startswith("IDS:") and runs:
                runs[-1][1].extend(int(t) for t in line[4:].split())
    return runs


def install(build_dir, prefix):
    subprocess.run(["cmake", "--install", build_dir, "--prefix", prefix], check=True, stdout=subprocess.DEVNULL)
    env = dict(os.environ, PKG_CONFIG_PATH=os.path.join(prefix, "lib", "pkgconfig"))
    pc = lambda *args: subprocess.run(["pkg-config", *args, "kvq"], env=env, check=True, capture_output=True,
                                      text=True).stdout.strip()
    libdir, includedir = pc("--variable=libdir"), pc("--variable=includedir")
    check(os.path.realpath(libdir) == os.path.realpath(os.path.join(prefix, "lib")),
          f"pkg-config's libdir {libdir} is the install's lib folder")
    libs = pc("--libs").split()
    check(any(a.startswith("-L") and os.path.realpath(a[2:]) == os.path.realpath(libdir) for a in libs) and
          "-lkvq" in libs, f"pkg-config --libs: {' '.join(libs)}")
    return os.path.join(libdir, "libkvq.so"), os.path.join(includedir, "kvq.h")


def check_exports(lib_path, header_path):
    """The library's defined dynamic symbols are exactly the functions kvq.h declares (KVQ_API)."""
    nm = subprocess.run(["nm", "-D", "--defined-only", lib_path], check=True, capture_output=True, text=True).stdout
    exported = {line.split()[-1] for line in nm.splitlines() if line.strip()}
    with open(header_path, encoding="utf-8") as f:
        declared = set(re.findall(r"\bKVQ_API\b[^;(]*?\b(kvq_\w+)\s*\(", f.read()))
    check(len(declared) > 30, f"kvq.h declares {len(declared)} KVQ_API functions")
    check(exported == declared, f"nm -D lists exactly kvq.h's functions ({len(exported)} exported; only in the "
          f"library: {sorted(exported - declared)[:8]}; missing: {sorted(declared - exported)[:8]})")


def kvq_run(kvq, model, tok, prompt, n):
    out = subprocess.run([kvq, "run", "-m", model, "--tokenizer", tok, "-p", prompt, "-n", str(n), "--temp", "0",
                          "--kv", "f32", "-t", "1", "--json"], stdin=subprocess.DEVNULL, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def main(build_dir, source_dir, kvq):
    with tempfile.TemporaryDirectory(prefix=f"kvq_ctypes_{os.getpid()}_") as prefix:
        lib_path, header_path = install(build_dir, prefix)
        check_exports(lib_path, header_path)
        lib = ctypes.CDLL(lib_path)
        bind(lib)

        version = subprocess.run([kvq, "--version"], check=True, capture_output=True, text=True).stdout.strip()
        check(version == "kvq " + lib.kvq_version().decode(), f"kvq_version() is `{version}`'s")

        # A missing file: NULL, and the error text names it.
        missing = os.path.join(prefix, "no_such_model.gguf")
        check(lib.kvq_model_load(missing.encode(), None) is None and missing in lib.kvq_last_error().decode(),
              f"a missing model is an error naming it: {lib.kvq_last_error().decode()!r}")

        models = os.path.join(source_dir, "models/stories260K")
        model, tok = os.path.join(models, "stories260K.bin"), os.path.join(models, "tok512.bin")
        mo = ModelOptions()
        lib.kvq_model_options_init(ctypes.byref(mo))
        check(mo.struct_size == ctypes.sizeof(ModelOptions), f"struct_size {mo.struct_size} is ctypes' sizeof")
        mo.tokenizer_path, mo.threads, mo.kv_key_format, mo.kv_value_format = tok.encode(), 1, b"f32", b"f32"
        mo.struct_size = 8  # a struct the library does not know: refused, naming it
        check(lib.kvq_model_load(model.encode(), ctypes.byref(mo)) is None and
              "kvq_model_options" in lib.kvq_last_error().decode(),
              f"a wrong struct_size is refused: {lib.kvq_last_error().decode()!r}")
        mo.struct_size = ctypes.sizeof(ModelOptions)
        m = lib.kvq_model_load(model.encode(), ctypes.byref(mo))
        check(m is not None, f"kvq_model_load({model})", lib.kvq_last_error().decode())
        if m is None:
            return 1
        info = ModelInfo()
        lib.kvq_model_info_init(ctypes.byref(info))
        check(lib.kvq_model_get_info(m, ctypes.byref(info)) == 0 and info.vocab_size == 512 and
              info.architecture == b"llama", f"model info: {info.architecture}, vocabulary {info.vocab_size}")

        for prompt, golden in golden_prompts(source_dir):
            n_prompt = lib.kvq_tokenize(m, prompt.encode(), -1, None, 0)
            want_ids = golden[n_prompt:]
            max_tokens = len(want_ids)
            if want_ids and want_ids[-1] == 1:
                want_ids = want_ids[:-1]  # run.c stopped on BOS, which kvq does not keep
            pieces, tokens = [], []

            def on_token(token, piece, _user):
                tokens.append(token)
                pieces.append(piece)
                return 1

            callback = TOKEN_FN(on_token)
            go = GenerateOptions()
            lib.kvq_generate_options_init(ctypes.byref(go))
            go.max_tokens, go.temperature = max_tokens, 0.0
            s = lib.kvq_session_new(m, None)
            n = ctypes.c_int64(0)
            rc = lib.kvq_session_generate(s, prompt.encode(), ctypes.byref(go), callback, None, ctypes.byref(n))
            text = b"".join(pieces).decode("utf-8")
            check(rc == 0, f"generate {prompt!r}", lib.kvq_last_error().decode())
            check(tokens[:len(want_ids)] == want_ids and n.value == len(want_ids),
                  f"{prompt!r}: the streamed ids are run.c's golden ids ({n.value} tokens)")
            ref = kvq_run(kvq, model, tok, prompt, max_tokens)
            check(text == ref["completion"] and ref["tokens"] == golden[:n_prompt] + tokens[:n.value],
                  f"{prompt!r}: the text equals kvq run's ({len(text)} bytes, finish "
                  f"{lib.kvq_session_finish_reason(s)}, kvq run: {ref['finish_reason']})")
            lib.kvq_session_free(s)

        chat = (ChatMessage * 1)(ChatMessage(b"user", b"Hello"))
        size = lib.kvq_apply_chat_template(m, chat, 1, None, None, 0)
        buf = ctypes.create_string_buffer(size + 1)
        check(lib.kvq_apply_chat_template(m, chat, 1, None, buf, size + 1) == size and
              buf.value == b"<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
              f"a chat renders as ChatML (the model has no template): {buf.value!r}")
        lib.kvq_model_free(m)
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    sys.exit(main(*sys.argv[1:]))
