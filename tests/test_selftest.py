"""`python -m rlkernels selftest`: on this GPU-less machine it refuses plainly, and its dry run (the same
steps on the CPU) writes the report a GPU run would, with the oracle table parsed from the test run."""

import subprocess
import sys

import pytest
import torch

from rlkernels import selftest


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the GPU-less refusal")
def test_without_a_gpu_it_says_what_can_run_instead():
    done = subprocess.run([sys.executable, "-m", "rlkernels", "selftest"], capture_output=True, text=True)
    assert done.returncode == 2
    assert "no CUDA device" in done.stderr and "compile-check" in done.stderr


@pytest.mark.slow
def test_dry_run_writes_the_report(tmp_path):
    report = tmp_path / "report.md"
    done = subprocess.run(
        [sys.executable, "-m", "rlkernels", "selftest", "--dry-run", "--report", str(report)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    text = report.read_text()
    assert "| oracle tests | passed |" in text
    assert "| test_kl | cpu | float32 |" in text  # the oracle table: op x flavor x dtype
    assert "gpu workload" in text and "| benchmark | passed |" in text


def test_junit_parsing_reads_flavor_and_dtype_from_test_ids(tmp_path):
    xml = tmp_path / "junit.xml"
    xml.write_text(
        """<testsuites><testsuite>
<testcase classname="tests.test_kl" name="test_ref[cuda-on-cpu-bfloat16-k3-10.0-shape0]"/>
<testcase classname="tests.test_kl" name="test_ref[triton-float16-k1-None-shape1]">
  <failure message="AssertionError: kernel error 1e-2 &gt; ...">trace</failure></testcase>
<testcase classname="tests.test_gae" name="test_empty[cuda]"><skipped/></testcase>
</testsuite></testsuites>"""
    )
    parsed = selftest.parse_junit(xml)
    assert parsed["table"][("test_kl", "cuda-on-cpu", "bfloat16")]["passed"] == 1
    assert parsed["table"][("test_kl", "triton", "float16")]["failed"] == 1
    assert parsed["table"][("test_gae", "cuda", "-")]["skipped"] == 1
    assert parsed["failures"] == [
        "test_kl::test_ref[triton-float16-k1-None-shape1]: AssertionError: kernel error 1e-2 > ..."
    ]
