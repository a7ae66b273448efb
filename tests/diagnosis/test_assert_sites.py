"""Every device-side assert site of PyTorch maps to a rule (or to pytorch-internal).

tests/data/pytorch_assert_sites.json lists the sites, generated from PyTorch's sources by
tests/data/extract_assert_sites.py, each with the commit (or copy) it came from (see its
"about"). A site whose text no rule knows would reach the user as "unknown-assert": adding a
PyTorch kernel check means adding a rule.

Pastes lose parts of the device line (issue 9, item 4): the path ("nll_loss_..._kernel_2d:
block: ..."), or everything but the kernel function, or everything but the condition. So each
site must also be recognised from its condition alone and from its function alone.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

import pytest

from nb_cudaguard import diagnose
from nb_cudaguard.diagnosis.model import AssertLine
from nb_cudaguard.diagnosis.rules import rule_for

DATA = json.loads((Path(__file__).parent.parent / "data" / "pytorch_assert_sites.json").read_text())
SITES = DATA["sites"]


def _id(site: dict) -> str:
    return f"{site['file']}:{site.get('function') or site.get('line')}:{site['printed'][:40]}"


def _causes_by(key: str) -> dict[str, set[str]]:
    causes: dict[str, set[str]] = defaultdict(set)
    for site in SITES:
        if site.get(key):
            causes[site[key]].add(site["cause"])
    return causes


CAUSES_BY_CONDITION = _causes_by("printed")
CAUSES_BY_FUNCTION = _causes_by("function")

# Conditions that say too little without their file: which cause they mean depends on the file
# (or the function) that printed them. A line with only such a condition is still a poisoned
# context (tests/diagnosis/test_pasted_texts.py); it names no specific cause.
GENERIC_CONDITIONS = {
    "": "torch._assert_async without a message prints an empty condition",
    "cond && message": "ValidateCompressedIndicesCommon.h's _assert: only the file says sparse",
    "end >= begin": "EmbeddingBag offsets without the file could be any kernel's range check",
    "batch size must match the number of labels": "a user's own _assert_async message",
}
# Lambdas of TensorIterator kernels all print "operator()".
GENERIC_FUNCTIONS = {"operator()", "_assert"}


@pytest.mark.parametrize("site", SITES, ids=[_id(s) for s in SITES])
def test_every_pytorch_assert_site_maps_to_a_rule(site):
    line = AssertLine(file=site["file"], condition=site["printed"], function=site.get("function"))
    rule = rule_for(line)
    assert rule is not None, site
    assert rule.cause == site["cause"], site


@pytest.mark.parametrize("site", SITES, ids=[_id(s) for s in SITES])
def test_every_site_printed_as_the_gpu_prints_it_names_its_cause(site):
    function = site.get("function") or "kernel"
    printed = (
        f"/pytorch/{site['path']}:{site.get('line') or 100}: {function}: block: [0,0,0], "
        f"thread: [0,0,0] Assertion `{site['printed']}` failed."
    )
    diagnosis = diagnose(printed + "\nRuntimeError: CUDA error: device-side assert triggered")
    assert diagnosis is not None and diagnosis.sticky
    assert diagnosis.cause == site["cause"], printed


WITH_CONDITION = [s for s in SITES if s["printed"] not in GENERIC_CONDITIONS]


@pytest.mark.parametrize("site", WITH_CONDITION, ids=[_id(s) for s in WITH_CONDITION])
def test_every_site_is_recognised_from_its_condition_alone(site):
    rule = rule_for(AssertLine(file="", condition=site["printed"]))
    assert rule is not None, site
    # A condition several families print ("false", "index >= 0") names one of their causes.
    assert rule.cause in CAUSES_BY_CONDITION[site["printed"]], site
    if len(CAUSES_BY_CONDITION[site["printed"]]) == 1:
        assert rule.cause == site["cause"]


WITH_FUNCTION = [s for s in SITES if s.get("function") and s["function"] not in GENERIC_FUNCTIONS]


@pytest.mark.parametrize("site", WITH_FUNCTION, ids=[_id(s) for s in WITH_FUNCTION])
def test_every_kernel_function_is_recognised_from_its_name_alone(site):
    """A line cut to its kernel function (condition lost, or two threads' lines interleaved)."""
    rule = rule_for(AssertLine(file="", condition="", function=site["function"]))
    assert rule is not None, site
    causes = CAUSES_BY_FUNCTION[site["function"]]
    assert rule.cause in causes, site


@pytest.mark.parametrize("site", WITH_FUNCTION, ids=[_id(s) for s in WITH_FUNCTION])
def test_function_and_condition_without_the_file_name_the_sites_cause(site):
    """The function decides between families that print the same condition."""
    line = AssertLine(file="", condition=site["printed"], function=site["function"])
    rule = rule_for(line)
    assert rule is not None, site
    if site["printed"] not in GENERIC_CONDITIONS:
        assert rule.cause == site["cause"], site


def test_the_site_list_records_where_it_came_from():
    assert len(SITES) >= 100
    assert all(site["commit"] and site["cause"] for site in SITES)
    # The families issue 9 names: the vectorized gather kernel (2.8+), multinomial's
    # _assert_async, EmbeddingBag's offsets, max_unpool, repeat_interleave, poisson.
    printed = {site["printed"] for site in SITES}
    assert any("vectorized gather kernel" in text for text in printed)
    assert any(text.startswith("probability tensor contains") for text in printed)
    assert "end >= begin" in printed
    assert "maxind >= 0 && maxind < outputImageSize" in printed
    assert "result_size == cumsum_ptr[size - 1]" in printed


def test_each_site_read_from_a_forks_copy_names_that_copy():
    """A site read from one file of a fork (``--file``) names the repository, commit and path of
    the copy, so that the copy can be read again and the list rebuilt from it."""
    forked = [site for site in SITES if "source" in site]
    assert len(forked) >= 40
    for site in forked:
        repo, commit = site["commit"].split("@")
        assert re.fullmatch(r"[\w.-]+/[\w.-]+", repo) and re.fullmatch(r"[0-9a-f]{40}", commit)
        assert site["source"] == f"{site['commit']}:{site['path']}", site
    read = {entry["path"] for entry in DATA["files_read"]}
    # the files issue 9's sweep had to bring up to date, each read from a current copy
    for name in (
        *("Loss.cu", "NLLLoss2d.cu", "MultinomialKernel.cu", "IndexKernelUtils.cu"),
        # the second sweep's: distributions, fractional max pool, symmetric memory
        *("Distributions.cu", "FractionalMaxPool2d.cu", "FractionalMaxPool3d.cu"),
        *("nvshmem_extension.cu", "nccl_all_to_all_nd.cu"),
    ):
        assert any(s["file"] == name and "source" in s for s in SITES), name
    assert "aten/src/ATen/native/cuda/Bucketization.cu" in read
    # read whole without a device assert: grid_sample skips or clips out-of-range points
    assert "aten/src/ATen/native/cuda/GridSampler.cu" in read
    # an excerpt's entries carry no line number of their own making
    for site in SITES:
        if site.get("excerpt"):
            assert site["line"] is None, site


def _extractor():
    import importlib.util

    path = Path(__file__).parent.parent / "data" / "extract_assert_sites.py"
    spec = importlib.util.spec_from_file_location("extract_assert_sites", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_extractor_finds_each_macro_and_its_kernel_function():
    """The extractor itself, on a source written here in PyTorch's shapes."""
    module = _extractor()
    source = """
template <typename T>
__global__ void my_kernel(const T* x, int64_t n) {
  CUDA_KERNEL_LOOP(i, n) {
    CUDA_KERNEL_ASSERT(x[i] >= 0 &&
                       x[i] < n);  // a comment
  }
}
void launch(TensorIterator& iter) {
  gpu_kernel(iter, [] GPU_LAMBDA (float v) -> float {
    CUDA_KERNEL_ASSERT_MSG(v == v, "value is NaN");
    return v;
  });
}
__global__ static void other(int64_t a, int64_t b) {
  CUDA_KERNEL_ASSERT_PRINTF(a == b, "a (%ld) != b (%ld)", a, b);
}
"""
    found = module.sites(source, "aten/src/ATen/native/cuda/Mine.cu")
    assert [(s["function"], s["macro"], s["printed"], s["line"]) for s in found] == [
        ("my_kernel", "CUDA_KERNEL_ASSERT", "x[i] >= 0 && x[i] < n", 5),
        ("operator()", "CUDA_KERNEL_ASSERT_MSG", "value is NaN", 11),
        ("other", "CUDA_KERNEL_ASSERT_PRINTF", "a == b", 16),
    ]
    callers = module.sites('torch._assert_async(x.all(), "x must be true")\n', "torch/mine.py")
    assert [(s["function"], s["printed"]) for s in callers] == [
        ("_assert_async_cuda_kernel", "x must be true")
    ]
    # aten's own message-less checks (Indexing.cu's wrapIndexOnce) print an empty condition
    cpp = "  at::_assert_async(index.max() < dim_size);\n  at::_assert_async(ok, msg);\n"
    found = module.sites(cpp, "aten/src/ATen/native/cuda/Mine.cu")
    assert [(s["macro"], s["printed"], s["caller"]) for s in found] == [
        ("_assert_async", "", "aten/src/ATen/native/cuda/Mine.cu:1")
    ]


def test_a_check_inside_a_macro_prints_each_uses_arguments():
    """Loss.cu (2.x) checks labels through ``CHECK_INDEX_IN_CLASS(INDEX, N_CLASSES)``: the
    preprocessor substitutes the arguments before ``#cond``, so a device prints
    ``t >= 0 && t < n_classes`` (``t < n_classes`` for uint8 targets), never ``INDEX ...``."""
    module = _extractor()
    source = """
#define CHECK_IN(INDEX, N_CLASSES)                   \\
  if constexpr(std::is_unsigned_v<decltype(INDEX)>) { \\
    CUDA_KERNEL_ASSERT(INDEX < N_CLASSES);            \\
  } else {                                            \\
    CUDA_KERNEL_ASSERT(INDEX >= 0 && INDEX < N_CLASSES && "INDEX bad"); \\
  }

template <typename index_t>
__global__ void loss_kernel(const index_t* target, int64_t n_classes) {
  const index_t t = *target;
  CHECK_IN(t, n_classes);
}
__global__ void other_kernel(const int64_t* target, int64_t n_classes) {
  CHECK_IN(target[threadIdx.x],  n_classes);
}
"""
    found = module.sites(source, "aten/src/ATen/native/cuda/Mine.cu")
    assert [(s["function"], s["printed"], s["line"]) for s in found] == [
        ("loss_kernel", "t < n_classes", 12),
        ("other_kernel", "target[threadIdx.x] < n_classes", 15),
        ("loss_kernel", 't >= 0 && t < n_classes && "INDEX bad"', 12),
        (
            "other_kernel",
            'target[threadIdx.x] >= 0 && target[threadIdx.x] < n_classes && "INDEX bad"',
            15,
        ),
    ]


def test_the_extractor_reads_one_forks_file_and_names_it(tmp_path):
    """``--file OWNER/REPO@COMMIT:PATH=LOCAL``: a fork's current copy of one file, each site
    naming the copy it came from; an earlier list's entries of other files carry over."""
    module = _extractor()
    local = tmp_path / "Mine.cu"
    local.write_text("__global__ void k(int i, int n) {\n  CUDA_KERNEL_ASSERT(i < n);\n}\n")
    earlier = tmp_path / "earlier.json"
    older = {"file": "Mine.cu", "path": "aten/src/ATen/native/cuda/Mine.cu", "printed": "old"}
    same = {**older, "printed": "i < n", "function": "k", "commit": "v1.0"}
    earlier.write_text(json.dumps({"about": "a", "sites": [older, same]}))
    source = "someone/pytorch@" + "a" * 40 + ":aten/src/ATen/native/cuda/Mine.cu"
    result = module.main(["--file", f"{source}={local}", "--keep", str(earlier)])
    # the copy's site first, the older release's text kept, the same site once (the copy's)
    mine, old = result["sites"]
    assert (mine["function"], mine["printed"], mine["line"]) == ("k", "i < n", 2)
    assert mine["commit"] == "someone/pytorch@" + "a" * 40 and mine["source"] == source
    assert old == older


def test_an_excerpt_records_the_files_texts_but_no_line(tmp_path):
    """A file too long to save whole is saved as the functions that hold its asserts
    (``*.excerpt``): the texts and functions are the file's, the line numbers are not."""
    module = _extractor()
    local = tmp_path / "Mine.cu.excerpt"
    local.write_text(
        "__global__ void k(int i, int n) {\n  // ...\n  CUDA_KERNEL_ASSERT(i < n);\n}\n"
    )
    source = "someone/pytorch@" + "b" * 40 + ":aten/src/ATen/native/cuda/Mine.cu"
    result = module.main(["--file", f"{source}={local}"])
    (site,) = result["sites"]
    assert (site["file"], site["function"], site["printed"]) == ("Mine.cu", "k", "i < n")
    assert site["line"] is None and site["excerpt"] is True
    assert site["source"] == source
