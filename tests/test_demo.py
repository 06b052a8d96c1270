from __future__ import annotations

import io

import pytest

from jupyter_gpusched.cli.demo import run_demo


@pytest.mark.slow  # the demo's workload on the simulated cluster, real processes
@pytest.mark.asyncio
async def test_demo_workload_behaves_as_expected_on_the_embedded_cluster() -> None:
    out = io.StringIO()
    result = await run_demo(out=out, timeout_s=60)
    assert result.problems == []
    assert result.held_reasons  # a batch job waited for the interactive reserve
    text = out.getvalue()
    assert "a100-0" in text and "t4-0" in text and "cancelled by the demo" in text
