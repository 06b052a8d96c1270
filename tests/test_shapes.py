"""A queued job's request shape is derived once per spec and forgotten with the job."""

from __future__ import annotations

from _fixtures_policy import make_job

from jupyter_gpusched.packing.inventory import pack_request
from jupyter_gpusched.scheduling.shapes import Shapes


def test_a_shape_is_kept_while_the_job_keeps_its_spec_object() -> None:
    shapes = Shapes()
    job = make_job(1, gpus=2, gpu_models=["A100"])
    shapes.begin_pass()
    first = shapes.of(job)
    assert first.request == pack_request(job.spec)
    shapes.begin_pass()
    assert shapes.of(job) is first  # the next pass: nothing derived again

    changed = job.model_copy(update={"spec": job.spec.model_copy(update={"gpus": 4})})
    shapes.begin_pass()
    again = shapes.of(changed)
    assert again is not first and again.request.gpus == 4  # a changed spec: derived again


def test_equal_requests_share_a_key_and_different_ones_do_not() -> None:
    shapes = Shapes()
    shapes.begin_pass()
    a, b = shapes.of(make_job(1, gpus=2)), shapes.of(make_job(2, gpus=2, user="bob"))
    c = shapes.of(make_job(3, gpus=1))
    assert a.key == b.key != c.key
    assert a.admit_key == b.admit_key != c.admit_key


def test_jobs_a_pass_did_not_see_are_forgotten() -> None:
    shapes = Shapes()
    job = make_job(1)
    shapes.begin_pass()
    first = shapes.of(job)
    shapes.begin_pass()  # job 1 not in this pass (placed, cancelled)
    shapes.begin_pass()
    assert shapes.of(job) is not first
