"""Recognise CUDA errors in exception texts of every PyTorch era and in text as people paste it.

The texts are PyTorch's (c10/cuda/CUDAException.cpp, CUDAMiscFunctions.cpp, the allocators in
c10/cuda/), NVIDIA's (``cudaGetErrorString``, error_tables.py), and other programs' checks
(tests/diagnosis/test_reported_forms.py names the report of each).

Two rules decide. The error's *headline* names it, never PyTorch's boilerplate hint: until
recently "CUDA kernel errors might be asynchronously reported ..." was appended to every CUDA
error, out of memory included. And a poisoned context always wins: a sticky error named anywhere
in the text (a follow-on cuBLAS error's traceback often quotes the assert further down) makes the
text sticky, whatever its first line says.

Pasted text is rarely what the program printed: lines get flattened into one (issue titles,
dialogs), prefixed (timestamps, ``[rank3]:``), re-quoted, full-width or machine-translated.
``normalize`` and ``logical_lines`` undo what can be undone before any pattern runs.
"""

from __future__ import annotations

import html
import re
import unicodedata
from collections.abc import Callable, Iterable, Iterator

from .error_tables import BEFORE_10_1, DRIVER, HIP, HIP_LEGACY_CODES, HIP_OWN, RUNTIME
from .model import CudaError

_BY_CODE: dict[int, tuple[str, int, int | None, str, bool]] = {e[1]: e for e in RUNTIME}
_BY_NAME: dict[str, tuple[str, int, int | None, str, bool]] = {e[0]: e for e in RUNTIME}
# HIP's own errors first: their names must win over their codes ("hip error 911:
# hipErrorInvalidChannelDescriptor" is no external-device error).
for _name, _code, _sticky in HIP_OWN:
    _BY_NAME[_name] = (_name, _code, None, "", _sticky)
for _name, _code in DRIVER:
    if _code in _BY_CODE:
        _BY_NAME.setdefault(_name, _BY_CODE[_code])
for _name, _code in HIP:
    _code = HIP_LEGACY_CODES.get(_code, _code)
    if _code in _BY_CODE:
        _BY_NAME.setdefault(_name, _BY_CODE[_code])
# Longest first: "unspecified launch failure in prior launch" is not "unspecified launch failure".
# Errors whose cudaGetErrorString text is not known to us ("") are read by name or code only.
_BY_TEXT = sorted(((e[3].lower(), e) for e in RUNTIME if e[3]), key=lambda item: -len(item[0]))
_LEGACY = {code: _BY_NAME[name] for code, name in BEFORE_10_1.items()}
_TEXT_ENTRY = dict(_BY_TEXT)
_TEXT_ANYWHERE = re.compile(
    r"(?<!\w)(?:" + "|".join(re.escape(text) for text, _e in _BY_TEXT) + r")(?!\w)"
)


def _error(entry: tuple[str, int, int | None, str, bool], message: str) -> CudaError:
    return CudaError(entry[0], entry[1], entry[4], message.strip())


def error_text(name: str) -> str:
    """``cudaGetErrorString``'s text for a runtime error's name ("" where not known)."""
    entry = _BY_NAME.get(name)
    return entry[3] if entry else ""


def error_for_code(code: int) -> CudaError | None:
    """The runtime error with this code (the driver API's ``CUresult`` and HIP's ``hipError_t``
    share the codes: 710 is an assert, 700 an illegal address, ...)."""
    entry = _BY_CODE.get(HIP_LEGACY_CODES.get(code, code))
    return _error(entry, entry[3]) if entry else None


# --- normalising pasted text ---------------------------------------------------------------------
_PUNCTUATION = str.maketrans(
    {
        "\u2018": "'",
        "\u2019": "'",
        "\u201a": "'",
        "\u201b": "'",
        "\u2032": "'",
        "\u00b4": "'",
        "\u201c": '"',
        "\u201d": '"',
        "\u201e": '"',
        "\u00ab": '"',
        "\u00bb": '"',
        "\u3002": ".",
        "\u3001": ",",
        "\u300c": '"',
        "\u300d": '"',
        "\u2026": "...",
        "\u00a0": " ",
        "\u200b": None,
        "\ufeff": None,
    }
)


# Terminal colours: nbformat keeps them in a traceback's lines, and terminal pastes carry them.
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# Conditions copied from a web page keep their HTML escapes ("t &gt;= 0 &amp;&amp; ...").
_HTML_ESCAPE = re.compile(r"&(?:gt|lt|amp|quot|#39|#x27|#96);")
# VS Code's notebooks print a traceback's places as Markdown links to the cell or file:
# "Cell In[8], [line 2](vscode-notebook-cell:?execution_count=8&line=2)", "---> [2](...)",
# "File [~/x/module.py:1736](file:///home/x/module.py:1736), in ...": the link's text is Jupyter's.
_EDITOR_LINK = re.compile(r"\[([^\]\n]*)\]\((?:vscode-notebook-cell|file|vscode-[\w-]+):[^)\n]*\)")


def normalize(text: str) -> str:
    """Terminal colours, HTML escapes and editors' links removed; full-width punctuation,
    typographic quotes and invisible characters made plain ASCII."""
    if "\x1b" in text:
        text = _ANSI.sub("", text)
    if "&" in text and _HTML_ESCAPE.search(text):
        text = html.unescape(text)
    if "](" in text:
        text = _EDITOR_LINK.sub(r"\1", text)
    if text.isascii():
        return text
    return unicodedata.normalize("NFKC", text).translate(_PUNCTUATION)


# Prefixes that loggers and launchers put before each line; stripped before a line is read.
_LOG_PREFIX = re.compile(
    r"^(?:\s*(?:"
    r"\[?\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\]?"  # ISO time
    r"|\[?\d\d:\d\d:\d\d(?:[.,]\d+)?\]?"
    r"|[EWIF]\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ \S+:\d+\]"  # glog
    r"|\[(?:rank|default|Rank|RANK|worker|GPU)\s*\d+\]:?"  # torchrun [rank3]:, [default0]:
    r"|(?:rank|Rank)\s*\d+:"
    r"|\((?:\w+ )?pid=\d+(?:, ip=[\d.]+)?\)"  # Ray
    r"|\[\d+,\d+\]<(?:stdout|stderr)>:"  # Open MPI's mpirun --tag-output
    r"|\[(?:ERROR|WARNING|INFO|DEBUG|CRITICAL)\]"
    r"|(?:ERROR|WARNING|INFO|DEBUG|CRITICAL)(?::[\w.]+)?:(?!\w)"  # logging: ERROR:root:
    r"|\||>+"
    r")\s*)+"
)

# PyTorch's boilerplate, which names no error; a flattened paste is cut before each of these.
_BOILERPLATE_STARTS = (
    r"CUDA kernel errors might be asynchronously reported",
    r"HIP kernel errors might be asynchronously reported",
    r"For debugging consider passing \w+_LAUNCH_BLOCKING",
    r"Compile with .?TORCH_USE_\w+_DSA.? to enable",
    r"Search for .?(?:cuda|hip)Error\w+'? in https?://",
    r"The CUDA driver logged these messages",
    r"Device-side assertion tracking was not enabled",
    r"Device-side assertions were explicitly omitted",
)
_BOILERPLATE = re.compile("|".join(_BOILERPLATE_STARTS), re.IGNORECASE)
# Where a flattened line is cut: before boilerplate, before an exception's class name and before
# the C++ wrappers.
_CUT = re.compile(
    r"\s+(?=" + "|".join(_BOILERPLATE_STARTS) + r"|terminate called after throwing|what\(\):"
    r"|(?<![\w.])(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception): )",
    re.IGNORECASE,
)
# Cheap test that a long line can need cutting (the pattern above costs ~15 us a line).
_CUT_MARKS = (
    "rror: ", "xception: ", "asynchronously", "launch_blocking", "torch_use_", "search for",
    "terminate called", "what():", "driver logged", "device-side assertion",
)  # fmt: skip
# PyTorch names the error in its "Search for `cudaErrorAssert' ..." hint: a last resort when the
# headline was lost.
_SEARCH_FOR = re.compile(r"Search for .?((?:cuda|hip)Error\w+)")
_FRAME = re.compile(r'^\s*File "[^"]*", line \d+')


def logical_lines(text: str) -> Iterator[tuple[str, bool]]:
    """The text's lines, normalised, stripped of log prefixes and cut where they were flattened,
    each with whether it is the quoted source line of a traceback frame (code, not an error)."""
    after_frame = False
    for raw in normalize(text).splitlines():
        line = _LOG_PREFIX.sub("", raw, count=1) if raw[:1] in "[(|>0123456789EWIFDRrC" else raw
        if not line.strip():
            continue
        if _FRAME.match(line):
            after_frame = True
            yield line, False
            continue
        source, after_frame = after_frame and line[:1].isspace(), False
        if len(line) > 100 and any(mark in line.lower() for mark in _CUT_MARKS):
            for part in _CUT.split(line):
                if part.strip():
                    yield part, source
        else:
            yield line, source


# --- reading one line ----------------------------------------------------------------------------
_NAME = re.compile(r"\b(cudaError[A-Z]\w*|CUDA_ERROR_[A-Z0-9_]+|hipError[A-Z]\w*)\b")
_CODE = r"(?:\s*\(\s*(?P<code2>\d{1,4})\s*\))"

# Headline forms; each captures the error's text as `text` (and a name or code where printed).
_HEADLINES: tuple[re.Pattern[str], ...] = (
    # PyTorch 1.5+, HIP builds, the driver API, custom extensions and attention libraries:
    # "CUDA error: X", "CUDA Error: X (700)", "CUDA error (/src/flash_api.cpp:12): X",
    # "CUDA Runtime Error: X", "cuda error: cudaErrorX: X"; Paddle's "CUDA error(700), X";
    # "[CUDA] Error: X". A word glued in front ("RuntimeError:CUDA error", a retyped paste) is
    # allowed before an upper-case "CUDA" only.
    re.compile(
        r"(?:(?<![A-Za-z])(?i:CUDA|HIP)|CUDA)\]?(?i:(?: driver| runtime| kernel)? error"
        r"(?:\s*\([^)]*\))?\s*[:,]\s*"
        r"(?:(?P<name>(?:cuda|hip)Error\w+|CUDA_ERROR_\w+)\b\s*:?\s*)?)(?P<text>.*)"
    ),
    re.compile(r"Triton Error \[(?:CUDA|HIP)\]: (?P<text>.+)"),
    # <= 1.4: "cuda runtime error (59) : device-side assert triggered at /pytorch/aten/...cu:26"
    re.compile(
        r"\bcuda runtime error \((?P<code>\d+)\) : (?P<text>.+?)(?: at \S+:\d+)?$", re.IGNORECASE
    ),
    # THC: "THCudaCheck FAIL file=/pytorch/aten/src/THC/THCGeneral.cpp line=383 error=59 : ..."
    re.compile(r"\bTHCudaCheck FAIL file=\S+ line=\d+ error=(?P<code>\d+) : (?P<text>.+)"),
    # Thrust/CUB: "reduce failed to synchronize: device-side assert triggered",
    # "parallel_for failed: cudaErrorIllegalAddress: an illegal memory access was encountered"
    re.compile(r"\bfailed to synchronize:\s*(?:(?P<name>cudaError\w+):\s*)?(?P<text>.+)"),
    re.compile(r"\b\w+ failed(?: on \d+\w* step)?:\s*(?P<name>cudaError\w+):\s*(?P<text>.+)"),
    # glog's CHECK_EQ and Caffe2's CAFFE_ENFORCE_EQ of a cudaError_t (Caffe, Caffe2/Detectron,
    # TensorFlow): "Check failed: error == cudaSuccess (48 vs. 0)  no kernel image is ...",
    # "error == cudaSuccess. 2 vs 0. Error at: .../context_gpu.cu:343: out of memory", "Check
    # failed: error == cudaSuccess unspecified launch failure", "Check failed: CUDA_SUCCESS ==
    # cuCtxSetCurrent(context) (0 vs. 216)". The number is the error's code.
    re.compile(
        r"(?:==\s*)?\b(?:cudaSuccess|CUDA_SUCCESS|hipSuccess)\b[.\s]*"
        r"\(?(?P<code>\d{1,4})\s*vs\.?\s*0\)?\.?\s*(?P<text>.*)"
    ),
    re.compile(r"==\s*(?:cudaSuccess|CUDA_SUCCESS|hipSuccess)\b[.\s]*(?P<text>[A-Za-z].*)"),
    re.compile(
        r"\b(?:cudaSuccess|CUDA_SUCCESS|hipSuccess)\s*==\s*[^\n]{0,160}?"
        r"\(0\s*vs\.?\s*(?P<code>\d{1,4})\)"
        r"\s*(?P<text>.*)"
    ),
    # TensorRT samples and plugins: "Cuda failure: invalid argument at line 123 in file
    # cudaFilter.cpp error status: 1", "Cuda failure: 700", "Cuda failure /src/Context.cu:361:
    # 'no kernel image is available for execution on the device'".
    re.compile(
        r"\bCUDA failure\b(?:\s+[^\s:]+:\d+)?\s*:?\s*(?:(?P<code>\d{1,4})\b(?![.,]\d)"
        r"|(?P<text>.*?)(?:\s*error status:\s*(?P<code2>\d{1,4}))?\s*$)",
        re.IGNORECASE,
    ),
    # Checks named after CUDA: "cudaCheckError() failed : no kernel image is available ...",
    # "Cuda check failed: Invalid device function", "Cuda kernel failed. Error: invalid device
    # function".
    re.compile(
        r"\bcuda\w*(?:\(\))?(?:\s+\w+)?\s+failed\s*[.:]\s*(?:error\s*:\s*)?(?P<text>.+)",
        re.IGNORECASE,
    ),
    # A code after "error#", "error code", "error no.=": "CUDA error in function cudaFree(v) at
    # CudaMemory.hpp:42, error# 100", "(CUDA error no.=700)".
    re.compile(
        r"\bCUDA\b[^\n]{0,160}?\berr(?:or)?[\s-]*(?:#|code|no\.?|number)\s*[:=]?\s*"
        r"(?P<code>\d{1,4})\b"
        r"(?P<text>)",
        re.IGNORECASE,
    ),
    # The error-checking macro of countless forum answers: "GPUassert: <text> <file> <line>".
    re.compile(r"\bGPUassert: (?P<text>.+)"),
    # numba: "CudaAPIError: [700] Call to cuCtxSynchronize results in UNKNOWN_CUDA_ERROR".
    re.compile(r"\[(?P<code>\d{1,4})\] Call to cu\w+ results in (?P<text>\w+)"),
    # CUDA samples' checkCudaErrors: "CUDA error at file.cu:12 code=700(cudaErrorIllegalAddress)".
    re.compile(r"\bCUDA error at \S+ code=(?P<code>\d+)\((?P<text>\w*)\)"),
    # TensorRT's logger around a CUDA call's error (its ErrorCode kCUDA_ERROR): "[TRT] [E] 1:
    # [defaultAllocator.cpp::deallocate::61] Error Code 1: Cuda Runtime (driver shutting down)",
    # "Cuda Driver (an illegal memory access was encountered)": the inner text is the error.
    re.compile(r"\bCuda (?:Runtime|Driver) \((?P<text>[^()]+)\)", re.IGNORECASE),
    # The cudaMallocAsync backend's OOM (c10/cuda/CUDAMallocAsyncAllocator.cpp): "Allocation on
    # device 0 would exceed allowed memory. (out of memory)".
    re.compile(r"\bAllocation on device (?:\d+ )?(?P<oom>would exceed allowed memory)"),
    # PyTorch's own allocator message for OOM: "CUDA out of memory. Tried to allocate 2.00 GiB
    # ...", and as people retype it: "cuda out of the memory", "CUDA out-of-memory", a word
    # glued in front ("xxxCUDA out of memory").
    re.compile(
        r"(?:CUDA|(?<![A-Za-z])HIP)[\s-]*(?:error\s*:?\s*)?(?P<oom>out[\s-]*of[\s-]*(?:the[\s-]+)?"
        r"(?:gpu[\s-]+)?mem(?:ory|[a-z]{0,4})(?![a-z]))",
        re.IGNORECASE,
    ),
)

# Where an error's headline starts: the line itself, after an exception's class name, after a C++
# wrapper's "what():".
_HEADLINE_START = re.compile(
    r"\s*(?:(?:[\w.]+(?:Error|Exception)|what\(\))\s*:\s*)*"
    r"(?:CUDA|HIP)(?: driver| runtime)? error\b"
)

# Sticky texts distinctive enough to trust without any prefix (custom wrappers, NCCL's
# "Cuda failure 'an illegal memory access was encountered'").
_BARE_STICKY = re.compile(
    r"device-side assert(?:ion)? triggered|an illegal memory access was encountered"
    r"|unspecified launch failure(?! in prior launch)|an illegal instruction was encountered"
    r"|the launch timed out and was terminated"
    r"|operation not supported on global/shared address space",
    re.IGNORECASE,
)
# Sticky texts that are too plain alone ("misaligned address" is also a CPU SIGBUS): trusted on
# a line that speaks of the GPU.
_PLAIN_STICKY = re.compile(
    r"misaligned address|hardware stack error|invalid program counter"
    r"|tensor memory not completely freed",
    re.IGNORECASE,
)
# Abridged forms of the sticky texts (issue titles, "CUDA error: illegal memory access"), each
# with its error; trusted on a line that speaks of the GPU, like the plain texts above.
ABRIDGED_STICKY: tuple[tuple[str, str], ...] = (
    ("cudaErrorAssert", r"device[- ]?side[- ]assert(?:ion)?s? (?:was )?(?:triggered|failed|hit)"),
    ("cudaErrorIllegalAddress", r"illegal (?:memory )?access|illegal address"),
    ("cudaErrorLaunchFailure", r"unspecified launch failure"),
    ("cudaErrorIllegalInstruction", r"illegal instruction"),
    ("cudaErrorLaunchTimeout", r"launch timed out"),
)
_ABRIDGED = tuple((name, re.compile(pattern, re.IGNORECASE)) for name, pattern in ABRIDGED_STICKY)
_GPU_CONTEXT = re.compile(r"cuda|\bgpu\b|\bhip\b|cupy|triton|nccl|kernel", re.IGNORECASE)

# Machine-translated pastes keep "CUDA" and translate the rest; (error name, translated texts).
TRANSLATED: tuple[tuple[str, str], ...] = (
    (
        "cudaErrorAssert",
        r"设备端断言|设备侧断言|裝置端斷言|設備端斷言|デバイス側(?:の)?(?:アサート|アサーション)"
        r"|geräteseitige[rn]? (?:Assertion|Zusicherung)"
        r"|assertion (?:côté|du côté de l')\s*(?:appareil|périphérique|dispositif)"
        r"|aserci[oó]n (?:del lado del|en el) dispositivo"
        r"|asser[cç][aã]o (?:do lado do|no) dispositivo|asserzione lato dispositivo"
        r"|утверждение на стороне устройства|assert на стороне устройства"
        r"|장치 측 (?:어설션|assert)|디바이스 측 (?:어설션|assert)",
    ),
    (
        "cudaErrorIllegalAddress",
        r"非法(?:的)?内存访问|非法記憶體存取|不正なメモリアクセス|illegale[rn]? Speicherzugriff"
        r"|accès (?:à la )?mémoire illégal|acceso (?:a memoria )?ilegal"
        r"|acceso ilegal a (?:la )?memoria"
        r"|acesso (?:à memória )?ilegal|acesso ilegal à memória"
        r"|недопустимый доступ к памяти|незаконный доступ к памяти"
        r"|잘못된 메모리 (?:액세스|접근)|불법 메모리 (?:액세스|접근)",
    ),
    (
        "cudaErrorLaunchFailure",
        r"未指定的启动失败|未指定的啟動失敗|不特定の起動エラー|nicht spezifizierter Startfehler"
        r"|échec de lancement non spécifié|fallo de lanzamiento no especificado"
        r"|неопределенный сбой запуска|지정되지 않은 실행 실패",
    ),
)
_TRANSLATED = tuple((name, re.compile(pattern, re.IGNORECASE)) for name, pattern in TRANSLATED)

# Library errors that follow a poisoned context (cuBLAS's CUBLAS_STATUS_NOT_INITIALIZED after an
# assert, NVIDIA's driver_types.h: every later call fails) or stand on their own.
_LIBRARY = re.compile(
    r"\b(?P<text>(?:CUBLAS|CUSOLVER|CUSPARSE|CUFFT|CURAND|CUDNN|NCCL)_STATUS_(?!SUCCESS\b)\w+"
    r"|cuDNN error: \w+|Creating MTGP constants failed|NCCL error\b.*)"
)

# Cheap test that a line can name a CUDA error at all: most lines of a long log cannot. Plain
# substring tests of the lowered line; a regular expression of alternatives costs 10x more.
_RELEVANT_WORDS = (
    "cuda", "hip", "gpu", "device", "illegal", "launch", "misaligned", "hardware stack",
    "program counter", "tensor memory", "synchroniz", "failed", "status_", "mtgp", "nccl",
    "allowed memory",
)  # fmt: skip
_TRANSLATED_ANY = re.compile("|".join(p for _n, p in TRANSLATED), re.IGNORECASE)


def _relevant(line: str) -> bool:
    lowered = line.lower()
    if any(word in lowered for word in _RELEVANT_WORDS):
        return True
    return not line.isascii() and _TRANSLATED_ANY.search(line) is not None


# A device assert line (assert_lines.py reads those) is no headline; thousands of them are normal.
_DEVICE_LINE = re.compile(r"block: ?\[[^\]]*\],? ?thread: ?\[[^\]]*\] ?Assertion")


# Codes that no current CUDA returns: the profiler's (deprecated since CUDA 5.0, driver_types.h)
# and 13.3's new translation error. A bare 6, 7, 8 or 10 in a log is the launch error that had
# the number before CUDA 10.1 (Caffe's "Check failed: error == cudaSuccess (8 vs. 0)").
_NOT_RETURNED = (
    "cudaErrorProfilerNotInitialized",
    "cudaErrorProfilerAlreadyStarted",
    "cudaErrorProfilerAlreadyStopped",
    "cudaErrorVersionTranslation",
)


# What tells which CUDA printed a number (the renumbering came with CUDA 10.1, February 2019):
# a CUDA version (nvcc's "compilation tools, release 9.0", "CUDA Version 10.0", "cuda-9.2",
# "libcudart.so.8.0", "cudart64_100.dll", a wheel's "+cu92"), a date in the log's own
# timestamps, a GPU that needs CUDA 11 or newer (Ampere and later).
_CUDA_VERSION = re.compile(
    r"(?i)(?:\bcuda[-_ ]?(?:version|toolkit|runtime)?[ :=,v_-]*|compilation tools, release "
    r"|libcudart\.so\.)(?P<major>\d{1,2})\.(?P<minor>\d)\b"
    r"|\bcudart64_(?P<dll>\d{2,3})\.dll|\+cu(?P<wheel>\d{2,3})\b"
)
_LOG_YEAR = re.compile(
    r"(?<![\d.])(?P<year>20[0-3]\d)[-/](?:0[1-9]|1[0-2])[-/][0-3]\d\b"
    r"|\b(?:0[1-9]|1[0-2])/[0-3]\d/(?P<year2>20[0-3]\d)\b"
)
_NEW_GPU = re.compile(
    r"\b(?:A100|A10G?|A30|A40|A800|H100|H200|H800|H20|B200|GB200|L4|L40S?"
    r"|RTX ?[345]0[5-9]0(?: Ti)?|RTX ?A[2-6]000|sm_(?:8[0-9]|9[0-9]|1[0-2][0-9]))\b"
)


# "CUDA_SUCCESS == dynload::cuCtxSetCurrent(context) (0 vs. 216)": a CUresult, numbered as today
_NEVER_RENUMBERED = re.compile(r"\bCUDA_SUCCESS\b|\bhipSuccess\b|\bcu[A-Z]\w*\(|\bhip[A-Z]\w*\(")


def _renumbered(major: int, minor: int) -> str:
    return "new" if (major, minor) >= (10, 1) else "old"


def numbering_era(text: str) -> str | None:
    """Which numbering a text's error codes use: "old" (before CUDA 10.1), "new", or None where
    the text does not say or says both."""
    eras: set[str] = set()
    for found in _CUDA_VERSION.finditer(text):
        digits = found.group("dll") or found.group("wheel")
        if digits:
            major, minor = int(digits[:-1]), int(digits[-1])
        else:
            major, minor = int(found.group("major")), int(found.group("minor"))
        if 4 <= major <= 13:
            eras.add(_renumbered(major, minor))
    for found in _LOG_YEAR.finditer(text):
        year = int(found.group("year") or found.group("year2"))
        if year != 2019:
            eras.add("new" if year >= 2020 else "old")
    if _NEW_GPU.search(text):
        eras.add("new")
    return eras.pop() if len(eras) == 1 else None


_Entry = tuple[str, int, int | None, str, bool]


def _printed_code(code: int, era: str | None = None) -> _Entry | None:
    """The error a code printed in a text stands for, in the numbering of ``era``. Where the text
    does not say, the current one, unless it is never returned or only the old numbering has
    the code; where the two numberings name different errors, the one that breaks the context,
    since a restart that was not needed costs less than one that was."""
    current, legacy = _BY_CODE.get(code), _LEGACY.get(code)
    if legacy is None or current is None or legacy is current:
        return current or legacy
    if era == "old" or current[0] in _NOT_RETURNED:
        return legacy
    if era == "new" or current[4] or not legacy[4]:
        return current
    return legacy


def _both_meanings(code: int, era: str | None) -> str:
    """What a code means in each numbering, where the text leaves the era open and they differ."""
    current, legacy = _BY_CODE.get(code), _LEGACY.get(code)
    if era is not None or current is None or legacy is None or legacy is current:
        return ""
    if current[0] in _NOT_RETURNED:
        return ""
    return (
        f"error {code} is {legacy[0]} ({legacy[3]}) in CUDA before 10.1 and {current[0]} "
        f"({current[3] or 'no text'}) since; nothing in the text says which CUDA printed it"
    )


def _known_text(
    text: str, *, anywhere: bool = False, distinctive: bool = False
) -> CudaError | None:
    """The runtime error whose ``cudaGetErrorString`` text ``text`` starts with (after quotes), or
    with ``anywhere``, holds as words ("Kernel execution failed : (8) invalid device function.").
    With ``distinctive``, only texts that speak of the GPU: "invalid argument", "operation not
    permitted" and "out of memory" are also strerror()'s words and other programs'."""
    lowered = text.strip().lower().lstrip("'\"` ")
    for etext, entry in _BY_TEXT:
        if lowered.startswith(etext) and (not distinctive or _GPU_WORDS.search(etext)):
            return _error(entry, text)
    if anywhere:
        for found in _TEXT_ANYWHERE.finditer(lowered):
            if not distinctive or _GPU_WORDS.search(found.group(0)):
                return _error(_TEXT_ENTRY[found.group(0)], text)
    return None


# Words no CPU error uses ("misaligned address" and "illegal instruction" are a CPU's too).
_GPU_WORDS = re.compile(
    r"device|kernel|launch|cuda|ptx|texture|surface|memcpy|syncthreads|peer|ecc|driver|grid",
    re.IGNORECASE,
)


def _lookup(
    text: str, name: str | None, code: int | None, headline: bool = False, era: str | None = None
) -> CudaError:
    message = text.strip()
    if name and name in _BY_NAME:
        return _error(_BY_NAME[name], message)
    lowered = message.lower().lstrip("'\"` ")
    # A headline's text may carry its own prefix ("Error at: context_gpu.cu:343: out of memory").
    by_text = _known_text(message, anywhere=headline)
    if by_text is not None:
        return by_text
    named = _NAME.search(message)
    if named and named.group(1) in _BY_NAME:
        return _error(_BY_NAME[named.group(1)], message)
    if code is not None:
        by_code = _printed_code(code, era)
        if by_code:
            return _error(by_code, message)
    library = _LIBRARY.search(text)
    if library:
        return CudaError(library.group("text").split(":")[0].strip(), code, False, message)
    bare = _BARE_STICKY.search(text)
    if bare:
        return _lookup(bare.group(0), None, None)
    for abridged, pattern in _ABRIDGED:
        if pattern.search(text) and "prior launch" not in lowered:
            return _error(_BY_NAME[abridged], message)
    return CudaError(name or "cudaError", code, False, message)


def classify_line(line: str, era: Callable[[], str | None] | None = None) -> CudaError | None:
    """The CUDA error a single (logical) line announces, or None. ``era`` tells, when asked,
    which numbering the text's error codes use (see numbering_era)."""
    if not _relevant(line) or _BOILERPLATE.match(line.lstrip()) or _DEVICE_LINE.search(line):
        return None
    for pattern in _HEADLINES:
        match = pattern.search(line)
        if match:
            groups = match.groupdict()
            number = groups.get("code") or groups.get("code2")
            if number is not None and int(number) == 0:
                continue  # cudaSuccess: "CUDA error code: 0" reports no error
            text = "out of memory" if groups.get("oom") else groups.get("text") or ""
            printed = int(number) if number else None
            by_code = (
                printed is not None
                and not groups.get("name")
                and not _known_text(text, anywhere=True)
            )
            numbering = (
                "new"  # the driver API's and HIP's codes were never renumbered
                if _NEVER_RENUMBERED.search(line)
                else era()
                if by_code and era is not None
                else None
            )
            found = _lookup(text, groups.get("name"), printed, True, numbering)
            if found.name == "cudaError" and found.code is None and not _HEADLINE_START.match(line):
                # "checking for CUDA error: none" names no error: only an error's own headline
                # may carry a text no table knows.
                continue
            message = line.strip()
            both = _both_meanings(printed, numbering) if by_code and printed is not None else ""
            return CudaError(
                found.name, found.code, found.sticky, f"{message} ({both})" if both else message
            )
    named = _NAME.search(line)
    if named and named.group(1) in _BY_NAME:
        return _error(_BY_NAME[named.group(1)], line)
    bare = _BARE_STICKY.search(line) or (_GPU_CONTEXT.search(line) and _PLAIN_STICKY.search(line))
    if bare:
        found = _lookup(bare.group(0), None, None)
        return CudaError(found.name, found.code, found.sticky, line.strip())
    if _GPU_CONTEXT.search(line):
        for name, pattern in _ABRIDGED:
            if pattern.search(line) and "prior launch" not in line.lower():
                return _error(_BY_NAME[name], line)
        for name, pattern in _TRANSLATED:
            if pattern.search(line):
                return _error(_BY_NAME[name], line)
    library = _LIBRARY.search(line)
    if library:
        return CudaError(library.group("text").split(":")[0].strip(), None, False, line.strip())
    failed = _FAILED_WITH.search(line)
    if failed:
        # "[ERROR]Line 679: '' failed: no kernel image is available for execution on the device",
        # "KERNEL_ERROR: invalid device function in ...cu at line 273 (error-code 8)", "Kernel
        # execution failed in file 'gpukernel_p3.cu' in line xxx : invalid device function.":
        # after a plain "failed ...:" or "error ...:", only a text that speaks of the GPU.
        gpu = _known_text(failed.group("text"), anywhere=True, distinctive=True)
        if gpu is not None:
            return CudaError(gpu.name, gpu.code, gpu.sticky, line.strip())
    return None


_FAILED_WITH = re.compile(
    r"(?:\b|(?<=_))(?:failed|error)\b[^:\n]{0,80}?:\s*(?P<text>.+)", re.IGNORECASE
)

# A check's own line, with the error on the next one (a message printed before the error's text,
# a wrapped paste): "checkMsg() CUDA error in foo.cu:12 :" then "invalid device function".
_HEAD_WORDS = ("uda", "UDA", "gpu", "GPU", "Gpu", "util", "heck", "HECK")  # any case
_CHECK_HEAD = re.compile(r"(?i)\b(?:cuda|gpu|cutil)|\w*check\w*\s*\(\)")
_ERROR_WORDS = re.compile(r"(?i)error|fail|:\s*$")
_CAUSE_LABEL = re.compile(
    r"(?i)\s*(?:(?:cause|reason|error|message|msg|details?|what\(\))\s*:\s*)?"
    r"[\[(]?\d{0,4}[\])]?\s*[:,-]?\s*"
)


def _checked_on_the_next_line(line: str, following: str) -> CudaError | None:
    """The error a check's line announces and the line after it names: the error's text on a
    line of its own, or a headline's text wrapped onto it ("[CUDA] Error: too many resources
    requested for" / "launch")."""
    if "ssert" in line or not any(word in line for word in _HEAD_WORDS) or _FRAME.match(line):
        return None  # a device assert line, a frame, or a line that names no check
    if not (_CHECK_HEAD.search(line) and _ERROR_WORDS.search(line)):
        return None
    joined = f"{line.strip()} {following.strip()}"
    label = _CAUSE_LABEL.match(following)
    found = _known_text(following[label.end() :] if label else following)
    if found is None:
        wrapped = classify_line(joined)
        found = wrapped if wrapped is not None and wrapped.name in _BY_NAME else None
    if found is None:
        return None
    return CudaError(found.name, found.code, found.sticky, joined)


def _embedded_headlines(lines: list[tuple[str, bool]]) -> list[str]:
    """The exception lines of tracebacks quoted inside a message.

    Errors re-raised from another thread or process quote the original traceback:
    ``nn.DataParallel`` ("Caught RuntimeError in replica 0 on device 0.\nOriginal Traceback ..."),
    DataLoader workers, ``torch.multiprocessing.spawn`` ("-- Process 0 terminated with the
    following error:\nTraceback ..."), Ray. The original error is the first unindented line
    after the frames; its continuation line follows it.
    """
    headlines: list[str] = []
    in_traceback = False
    for index, (line, _source) in enumerate(lines):
        if line.lstrip().startswith("Traceback (most recent call last)") or (
            "Original Traceback" in line
        ):
            in_traceback = True
        elif in_traceback and not line[0].isspace():
            headlines.extend(text for text, _s in lines[index : index + 2])
            in_traceback = False
    return headlines


def classify_text(text: str, *, first_line_only: bool = False) -> CudaError | None:
    """Classify an error text.

    With ``first_line_only`` (an exception's message), the *name* of a non-sticky error comes
    only from its first line, the ``what():`` line of a C++ ``terminate called ...`` wrapper
    and the exception line of a traceback quoted in the message. For a log, every line counts.
    Either way a sticky error anywhere (outside quoted source lines and boilerplate) wins.
    """
    lines = list(logical_lines(text))
    first: CudaError | None = None
    headline: set[str] | None = None
    if first_line_only and lines:
        wrapped = lines[0][0].startswith("terminate called after throwing")
        heads = [t for t, _s in (lines[:2] if wrapped else lines[:1])]
        headline = {*heads, *_embedded_headlines(lines)}
    searched: str | None = None
    era: list[str | None] = []

    def text_era() -> str | None:
        if not era:
            era.append(numbering_era(normalize(text)))
        return era[0]

    for index, (line, source) in enumerate(lines):
        if source:
            continue
        error = classify_line(line, text_era)
        if error is None and index + 1 < len(lines) and not lines[index + 1][1]:
            error = _checked_on_the_next_line(line, lines[index + 1][0])
        if error is None:
            if searched is None:
                hint = _SEARCH_FOR.search(line)
                searched = hint.group(1) if hint else None
            continue
        if error.sticky:
            return error
        if headline is None or line in headline:
            first = first or error
    if first is None and searched in _BY_NAME:
        # Only PyTorch's hint survived the paste: it names the error it was printed for.
        return _error(_BY_NAME[searched], f"Search for `{searched}'")
    return first


def exception_chain(error: BaseException) -> Iterable[BaseException]:
    """The exception, then its causes and contexts, without cycles."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def classify_exception(error: BaseException) -> CudaError | None:
    """The CUDA error behind an exception or anything it was raised from.

    A ``torch.AcceleratorError`` raised from C++ carries the ``cudaError_t`` as ``.error_code``:
    that code decides first, the text only adds what the code does not know (a sticky error
    named in the text still wins).
    """
    found: CudaError | None = None
    for link in exception_chain(error):
        try:
            message = str(link)
        except Exception:  # a broken __str__ is the user's, not a CUDA error
            continue
        result = classify_text(message, first_line_only=True)
        code = getattr(link, "error_code", None)
        by_code = (
            error_for_code(code) if isinstance(code, int) and not isinstance(code, bool) else None
        )
        if by_code is not None and not (result is not None and result.sticky):
            headline = message.strip().splitlines()[0] if message.strip() else by_code.message
            result = CudaError(by_code.name, by_code.code, by_code.sticky, headline)
        if result is None and type(link).__name__ == "OutOfMemoryError":
            result = CudaError("cudaErrorMemoryAllocation", 2, False, message.strip()[:200])
        if result is None:
            continue
        if isinstance(code, int) and result.code is None:
            result = CudaError(result.name, code, result.sticky, result.message)
        if result.sticky:
            return result
        found = found or result
    return found
