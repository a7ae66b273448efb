"""Error texts as other CUDA programs print them and as people retype them (issue 23, item 6).

Every text is verbatim from a public report (the repository and issue or pull request named;
issue titles as their authors wrote them), except the two marked as the issue's own examples.
Each names a cause and whether the context is broken: glog's ``CHECK_EQ`` of a ``cudaError_t``
(Caffe, Caffe2/Detectron, TensorFlow: the number is the error's code, numbered as CUDA numbered it
then), TensorRT's and its plugins' ``Cuda failure``, checks named after CUDA, a check's line with
the error on the next one, a device assert's condition quoted alone, and "CUDA out of memory"
retyped or glued to a word. The near misses beside them are never a CUDA error.
"""

from __future__ import annotations

import pytest

from nb_cudaguard import diagnose
from nb_cudaguard.diagnosis.error_tables import DRIVER, RUNTIME

# id: (text, cause, sticky, the runtime error it names, source)
REPORTED: dict[str, tuple[str, str, bool, str, str]] = {
    # --- glog CHECK_EQ / Caffe2 CAFFE_ENFORCE_EQ of a cudaError_t ---------------------------------
    "caffe 8 invalid device function": (
        "F1127 10:48:39.644999 18156 im2col.cu:59] Check failed: error == cudaSuccess (8 vs. 0)  "
        "invalid device function",
        "not-sticky",
        False,
        "cudaErrorInvalidDeviceFunction",
        "kevinlin311tw/caffe-cvprw15#31",
    ),
    "caffe 8 without its text": (
        "Check failed: error == cudaSuccess (8 vs. 0)",
        "not-sticky",
        False,
        "cudaErrorInvalidDeviceFunction",
        "facebookarchive/C3D#81",
    ),
    "caffe retyped without spaces": (
        "8468 im2col.cu 61   caffe check failed;error==cudaSuccess(8 vs.0) invalid device "
        "function.....",
        "not-sticky",
        False,
        "cudaErrorInvalidDeviceFunction",
        "microsoft/caffe#57",
    ),
    "caffe without the comparison": (
        "I am trying to do convolutional autoencoders and I've got this error: cudaSuccess "
        "(8 vs. 0)  invalid device function",
        "not-sticky",
        False,
        "cudaErrorInvalidDeviceFunction",
        "HyeonwooNoh/caffe#2",
    ),
    "caffe 77 without its text": (
        "Check failed: error == cudaSuccess (77 vs. 0)",
        "illegal-memory-access",
        True,
        "cudaErrorIllegalAddress",
        "NVIDIA/DIGITS#598",
    ),
    "caffe 77": (
        "Check failed: error == cudaSuccess (77 vs. 0)  an illegal memory access was encountered",
        "illegal-memory-access",
        True,
        "cudaErrorIllegalAddress",
        "rbgirshick/py-faster-rcnn#875",
    ),
    "current numbering, 209": (
        "[F unbatched_triangle_distance_cuda.cu:441] Check failed: error == cudaSuccess (209 vs. "
        "0)  no kernel image is available for execution on the device",
        "not-sticky",
        False,
        "cudaErrorNoKernelImageForDevice",
        "YuliangXiu/ICON#96",
    ),
    "caffe2 enforce, 2 vs 0": (
        "Dectectron error == cudaSuccess. 2 vs 0. Error at: "
        "/root/caffe2/caffe2/core/context_gpu.cu:343",
        "not-sticky",
        False,
        "cudaErrorMemoryAllocation",
        "facebookarchive/caffe2#1936",
    ),
    "caffe2 glued glog lines": (
        "F0628 19:13:22.730959  3624 context_gpu.h:107] Check failed: error == cudaSuccess "
        "unspecified launch failureF0628 19:13:22.730976  3635 context_gpu.h:107] Check failed: "
        "error == cudaSuccess unspecified launch failure",
        "launch-failure",
        True,
        "cudaErrorLaunchFailure",
        "facebookarchive/caffe2#1936",
    ),
    "tensorflow driver api": (
        "Check failed: CUDA_SUCCESS == dynload::cuCtxSetCurrent(context) (0 vs. 216)",
        "not-sticky",
        False,
        "cudaErrorDeviceAlreadyInUse",
        "tensorflow/tensorflow#526",
    ),
    # --- TensorRT samples and plugins: Cuda failure ---------------------------------------------
    "cuda failure with error status": (
        "Cuda failure: invalid argument at line 123 in file cudaFilter.cpp error status: 1",
        "not-sticky",
        False,
        "cudaErrorInvalidValue",
        "NVIDIA-AI-IOT/cuPCL#3",
    ),
    "cuda failure with a path": (
        "Cuda failure /home/fsy/fhe/ckks-gpu-core/src/public/Context.cu:361: 'no kernel image is "
        "available for execution on the device'",
        "not-sticky",
        False,
        "cudaErrorNoKernelImageForDevice",
        "scale-snu/ckks-gpu-core#2",
    ),
    "cuda failure, a code alone": (
        '"CUDA Failure: 1" failure of TensorRT 8.6 when running TransUNet on GPU 3080',
        "not-sticky",
        False,
        "cudaErrorInvalidValue",
        "NVIDIA/TensorRT#4146",
    ),
    "cuda failure 209 in a title": (
        "demo/BERT don't work on a Titan Xp Nvidia GPU with an error \"cuda failure 209\u201c",
        "not-sticky",
        False,
        "cudaErrorNoKernelImageForDevice",
        "NVIDIA/TensorRT#93",
    ),
    "cuda failure, unknown error": (
        "Cuda failure: unknown error",
        "not-sticky",
        False,
        "cudaErrorUnknown",
        "NVIDIA/TensorRT#3110",
    ),
    "cuda failure, sticky": (
        "Cuda failure: unspecified launch failure in file /yolo-tensorrt/modules/yolo.cpp at "
        "line 980",
        "launch-failure",
        True,
        "cudaErrorLaunchFailure",
        "enazoe/yolo-tensorrt#112",
    ),
    "paddle": (
        "ExternalError: CUDA error(999), unknown error.",
        "not-sticky",
        False,
        "cudaErrorUnknown",
        "PaddlePaddle/PaddleDetection#5565",
    ),
    "error number": (
        "[ERROR] CUDA error in function cudaFree(v) at "
        "/home/szb/ReSolve_dir/ReSolve/resolve/cuda/CudaMemory.hpp:42, error# 100",
        "not-sticky",
        False,
        "cudaErrorNoDevice",
        "ORNL/ReSolve#255",
    ),
    "error no.=": (
        "an illegal memory access was encountered(CUDA error no.=700)",
        "illegal-memory-access",
        True,
        "cudaErrorIllegalAddress",
        "NVIDIA/cuda-samples#38",
    ),
    # --- checks named after CUDA ----------------------------------------------------------------
    "cudaCheckError() failed": (
        "cudaCheckError() failed : no kernel image is available for execution on the device",
        "not-sticky",
        False,
        "cudaErrorNoKernelImageForDevice",
        "rowanz/neural-motifs#6",
    ),
    "cuda check failed": (
        "Cuda check failed: Invalid device function",
        "not-sticky",
        False,
        "cudaErrorInvalidDeviceFunction",
        "BVLC/caffe#3466",
    ),
    "cuda kernel failed": (
        "Cuda kernel failed. Error: invalid device function",
        "not-sticky",
        False,
        "cudaErrorInvalidDeviceFunction",
        "BVLC/caffe#138",
    ),
    "a bare failed:": (
        "[ERROR]Line 679: '' failed: no kernel image is available for execution on the device "
        "Aborted (core dumped)",
        "not-sticky",
        False,
        "cudaErrorNoKernelImageForDevice",
        "CVCUDA/CV-CUDA#14",
    ),
    "a bare Error:": (
        'What is the error "Error: no kernel image is available for execution on the device"',
        "not-sticky",
        False,
        "cudaErrorNoKernelImageForDevice",
        "kysucix/fusibile#15",
    ),
    "KERNEL_ERROR:": (
        "KERNEL_ERROR: invalid device function in /sw/relion/2.0beta-git/src/gpu_utils/"
        "cuda_ml_optimiser.cu at line 273 (error-code 8)",
        "not-sticky",
        False,
        "cudaErrorInvalidDeviceFunction",
        "3dem/relion#149",
    ),
    "CUT_CHECK_ERROR": (
        "Kernel execution failed in file 'gpukernel_p3.cu' in line xxx : invalid device function.",
        "not-sticky",
        False,
        "cudaErrorInvalidDeviceFunction",
        "barbagroup/gemsfmm#3",
    ),
    "Failed: Cuda error <file> '<text>'": (
        "Failed: Cuda error ./ripserplusplus/ripser++.cu:2371 'invalid device function'",
        "not-sticky",
        False,
        "cudaErrorInvalidDeviceFunction",
        "simonzhang00/ripser-plusplus#15",
    ),
    "getLastCudaError() on one line": (
        "tmp/luarocks_ccn2-scm-1-5152/cuda-convnet2.torch/cudaconv3/src/filter_acts.cu(2086) : "
        "getLastCudaError() CUDA error : filterActs: kernel execution failed : (8) invalid device "
        "function.",
        "not-sticky",
        False,
        "cudaErrorInvalidDeviceFunction",
        "soumith/cuda-convnet2.torch#35",
    ),
    # --- a check's line, the error on the next one ------------------------------------------------
    "getLastCudaError(), the rest on the next line": (
        "src/nvmatrix.cu(394): getLastCudaError() CUDA error : kSetupCurand: Kernel \n"
        "execution failed : (8) invalid device function.",
        "not-sticky",
        False,
        "cudaErrorInvalidDeviceFunction",
        "akrizhevsky/cuda-convnet2#4",
    ),
    "a block: the text under its label": (
        "CUDA Error:\n    File:       TensorRT-YOLO/source/deploy/vision/inference.cpp\n"
        "    Line:       558\n    Error code: 98\n    Error text: invalid device function",
        "not-sticky",
        False,
        "cudaErrorInvalidDeviceFunction",
        "laugh12321/TensorRT-YOLO#74",
    ),
    "CUDA kernel failed, the kernel on the next line": (
        "CUDA kernel failed : invalid device function\n"
        "void masked_ordered_query_ball_point_kernel_wrapper(int, int, int, float, int, const "
        "float*, const float*, const int*, const int*, int*, int*, float*, int*) at L:109 in "
        "_ext_src/src/masked_ordered_ball_query_gpu.cu",
        "not-sticky",
        False,
        "cudaErrorInvalidDeviceFunction",
        "zeliu98/CloserLook3D#22",
    ),
    "headline wrapped onto the next line": (
        "[1,0]<stderr>:terminate called after throwing an instance of\n"
        "'std::runtime_error'\n"
        "[1,0]<stderr>:  what():  [CUDA] Error: too many resources requested for\n"
        "launch",
        "not-sticky",
        False,
        "cudaErrorLaunchOutOfResources",
        "ComputationalRadiationPhysics/picongpu#725",
    ),
    "darknet's status line, then the error": (
        "CUDA status Error: file: ./src/blas_kernels.cu : () : line: 741 : build time: Sep  1 "
        "2022 - 20:13:02\n\n CUDA Error: an illegal instruction was encountered",
        "other-sticky",
        True,
        "cudaErrorIllegalInstruction",
        "AlexeyAB/darknet#8656",
    ),
    # --- a device assert's condition quoted alone -------------------------------------------------
    "condition alone": (
        "Assertion `t >= 0 && t < n_classes` failed.",
        "label-out-of-range",
        True,
        "cudaErrorAssert",
        "YuvalNirkin/hyperseg#26",
    ),
    "condition alone in a sentence": (
        "Regarding the assertion error- Assertion `t >= 0 && t < n_classes` failed",
        "label-out-of-range",
        True,
        "cudaErrorAssert",
        "sacmehta/ESPNet#82",
    ),
    "condition alone, a title": (
        "classify the 2-class dataset but encountered the error: Assertion `t >= 0 && t < "
        "n_classes` failed.",
        "label-out-of-range",
        True,
        "cudaErrorAssert",
        "ultralytics/ultralytics#4518",
    ),
    # --- out of memory, retyped -----------------------------------------------------------------
    "retyped with a typo": (
        "CUDA out of mempry",
        "not-sticky",
        False,
        "cudaErrorMemoryAllocation",
        "NickWilkinson37/voxseg#8",
    ),
    "hyphenated": (
        "CUDA out-of-memory when GPU memory is 11GB",
        "not-sticky",
        False,
        "cudaErrorMemoryAllocation",
        "edwardzhou130/PolarSeg#45",
    ),
    "glued to a Chinese word": (
        "请问您在训练的时候有没有遇到过cuda out of memory的情况\uff1f",
        "not-sticky",
        False,
        "cudaErrorMemoryAllocation",
        "Ixiaohuihuihui/GCC-Net#14",
    ),
    "glued, upper case": (
        "请问作者为什么我用urban100\uff0cManga109\uff0cDIV2K等数据集测试的时候\uff0c"
        "会出现CUDA out of memory的问题",
        "not-sticky",
        False,
        "cudaErrorMemoryAllocation",
        "SYSU-SAIL/DASR#85",
    ),
    "the issue's example: out of the memory": (
        "CUDA out of the memory",
        "not-sticky",
        False,
        "cudaErrorMemoryAllocation",
        "issue 23, item 6",
    ),
    "the issue's example: glued words": (
        "RuntimeError:CUDA out of memory. xxxCUDA out of memory",
        "not-sticky",
        False,
        "cudaErrorMemoryAllocation",
        "issue 23, item 6",
    ),
}


@pytest.mark.parametrize(
    ("text", "cause", "sticky", "name", "source"), REPORTED.values(), ids=REPORTED.keys()
)
def test_a_reported_form_names_its_cause_and_whether_the_context_broke(
    text: str, cause: str, sticky: bool, name: str, source: str
):
    diagnosis = diagnose(text)
    assert diagnosis is not None, source
    assert (diagnosis.cause, diagnosis.sticky) == (cause, sticky), source
    assert diagnosis.error is not None and diagnosis.error.name == name, source


# The codes these reports print and the error each names, held to NVIDIA's tables: the code of
# the current numbering or of the one before CUDA 10.1 (preferred where the current error is never
# returned: the profiler's, deprecated since CUDA 5.0); a driver API check's code is the driver's.
CODES = {
    "(8 vs. 0)": (
        "Check failed: error == cudaSuccess (8 vs. 0)",
        8,
        "cudaErrorInvalidDeviceFunction",
    ),
    "(48 vs. 0)": (
        "Check failed: error == cudaSuccess (48 vs. 0)",
        48,
        "cudaErrorNoKernelImageForDevice",
    ),
    "(59 vs. 0)": ("Check failed: error == cudaSuccess (59 vs. 0)", 59, "cudaErrorAssert"),
    "(710 vs. 0)": ("Check failed: error == cudaSuccess (710 vs. 0)", 710, "cudaErrorAssert"),
    "(77 vs. 0)": ("Check failed: error == cudaSuccess (77 vs. 0)", 77, "cudaErrorIllegalAddress"),
    "(6 vs. 0)": ("Check failed: error == cudaSuccess (6 vs. 0)", 6, "cudaErrorLaunchTimeout"),
    "(2 vs. 0)": ("Check failed: error == cudaSuccess (2 vs. 0)", 2, "cudaErrorMemoryAllocation"),
    "error status: 9": ("Cuda failure: error status: 9", 9, "cudaErrorInvalidConfiguration"),
    "Cuda failure: 700": ("Cuda failure: 700", 700, "cudaErrorIllegalAddress"),
    "(0 vs. 216)": (
        "Check failed: CUDA_SUCCESS == cuCtxSetCurrent(ctx) (0 vs. 216)",
        216,
        "cudaErrorDeviceAlreadyInUse",
    ),
}


@pytest.mark.parametrize(("text", "code", "name"), CODES.values(), ids=CODES.keys())
def test_a_printed_code_is_the_error_nvidias_tables_give_it(text: str, code: int, name: str):
    diagnosis = diagnose(text)
    assert diagnosis is not None and diagnosis.error is not None
    assert diagnosis.error.name == name
    entry = next(e for e in RUNTIME if e[0] == name)
    assert code in (entry[1], entry[2])
    assert diagnosis.sticky is entry[4]
    if "CUDA_SUCCESS" in text:
        assert any(c == code == entry[1] for _name, c in DRIVER)


def test_a_code_printed_alone_gets_its_meaning_said():
    diagnosis = diagnose("Check failed: error == cudaSuccess (48 vs. 0)")
    assert diagnosis is not None
    assert "no kernel image is available for execution on the device" in diagnosis.explanation


# id: (text, source): never a CUDA error
NEAR_MISSES: dict[str, tuple[str, str]] = {
    "THNN's CPU check": (
        "RuntimeError: Assertion `cur_target >= 0 && cur_target < n_classes' failed. at "
        "/opt/conda/conda-bld/pytorch_1512386481460/work/torch/lib/THNN/generic/"
        "ClassNLLCriterion.c:87",
        "udacity/aipnd-project#1",
    ),
    "THNN's CPU check, cut": (
        "RuntimeError: Assertion `cur_target >= 0 && cur_target < n_classes' failed.",
        "cydonia999/VGGFace2-pytorch#8",
    ),
    "Lua torch's CPU check": (
        "/home/albert/torch/install/bin/luajit:` /home/albert/torch/install/share/lua/5.1/nn/"
        "THNN.lua:110: Assertion `cur_target >= 0 && cur_target < n_classes' failed.  at "
        "/tmp/luarocks_nn-scm-1-3484/nn/lib/THNN/generic/ClassNLLCriterion.c:48 stack traceback:",
        "amdegroot/deepgenres.torch#1",
    ),
    "a label assert described in words": (
        "Assertion error with class labels (t >= 0 && t < n_classes).",
        "Yaozhuwa/FisheyeSeg#2",
    ),
    "a test suite's word": ("test cuda FAILURE", "JuliaGPU/CUDA.jl#496"),
    "a C program's own assert": ("Assertion `x > 0' failed.", "near miss of the bare form"),
    "darknet's assert(0) alone": ("Assertion `0' failed.", "near miss of the bare form"),
    "strerror's invalid argument": ("mount failed: invalid argument", "near miss of failed:"),
    "strerror's operation not permitted": (
        "error: cannot open /dev/mem: operation not permitted",
        "near miss of error:",
    ),
    "a CUDA line, then a usage error": (
        "[INFO] checking gpu...\ninvalid argument: --foo",
        "near miss of the next-line form",
    ),
    "a word ending in cuda": ("barracuda error: invalid argument", "near miss of glued words"),
    "an identifier": ("is_cuda_out_of_memory returned False", "near miss of the OOM form"),
    "no error": ("CUDA error code: 0", "near miss of the code form"),
    "cudaSuccess in prose": ("Using cudaSuccess as the return value", "near miss of glog"),
}


@pytest.mark.parametrize(("text", "source"), NEAR_MISSES.values(), ids=NEAR_MISSES.keys())
def test_a_near_miss_is_never_a_cuda_error(text: str, source: str):
    assert diagnose(text) is None, source


def test_a_library_check_with_a_code_is_the_library_error_not_a_runtime_code():
    # TingsongYu/cascaded_mobilenet-v2#14: 201 is curand's status, not cudaErrorInvalidContext.
    diagnosis = diagnose(
        "Check failed: status == CURAND_STATUS_SUCCESS (201 vs. 0) CURAND_STATUS_LAUNCH_FAILURE"
    )
    assert diagnosis is not None and not diagnosis.sticky
    assert diagnosis.error is not None and diagnosis.error.name == "CURAND_STATUS_LAUNCH_FAILURE"
