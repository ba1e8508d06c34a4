"""The vectorizable fp32 exp/tanh/log that the C++ CPU kernels use, swept over their whole range."""

import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_exp_tanh_and_log_within_two_ulp(tmp_path):
    exe = tmp_path / "vmath_accuracy"
    subprocess.run(
        [
            "g++",
            "-O3",
            "-fno-trapping-math",
            "-fno-math-errno",
            "-std=c++17",
            f"-I{ROOT / 'csrc' / 'include'}",
            str(ROOT / "tests" / "cpp" / "vmath_accuracy.cpp"),
            "-o",
            str(exe),
        ],
        check=True,
    )
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    worst = {k: float(v) for k, v in (line.split() for line in out.splitlines())}
    assert worst["points"] > 500_000
    assert worst["exp_max_ulp"] <= 2.0, out
    assert worst["tanh_max_ulp"] <= 2.0, out
    assert worst["log_points"] > 2_000_000
    assert worst["log_max_ulp"] <= 2.0, out
