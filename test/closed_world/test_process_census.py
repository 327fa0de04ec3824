"""The process census (`vradix_census.processes`) reads SGLang's launch code, not a list: a process
start SGLang adds is found by the scan and fails the census until it is classified (test_census.py runs the table
against the live code; here a planted start shows the failure)."""
import vradix_census as census
from vradix_census.processes import PROCESSES, enumerate_processes, sites_in

PLANTED = '''
import multiprocessing as mp, psutil, subprocess, uvicorn, grpc, ray

def launch_planted(ctx):
    ctx.Process(target=run_planted_frontend).start()
    psutil.Process().children()
    subprocess.run(["nvidia-smi"])

class Frontend:
    def serve(self):
        uvicorn.run("planted:app", workers=2)
        grpc.aio.server()

def join():
    return read_from_shared_memory("multi_tokenizer_args_1")

@ray.remote
class PlantedActor:
    pass
'''


def test_the_scan_finds_every_kind_of_process_start_and_nothing_else():
    assert sites_in(PLANTED, "srt.planted") == {
        "srt.planted:launch_planted -> ctx.Process(run_planted_frontend)",
        "srt.planted:Frontend.serve -> uvicorn.run()",
        "srt.planted:Frontend.serve -> grpc.aio.server()",
        "srt.planted:join -> read_from_shared_memory()",
        "srt.planted:PlantedActor -> ray.remote(actor)",
    }


def test_a_planted_process_start_fails_the_census():
    live = set(enumerate_processes())
    assert not census.unclassified(PROCESSES, live)
    planted = "srt.planted:launch_planted -> ctx.Process(run_planted_frontend)"
    assert census.unclassified(PROCESSES, live | sites_in(PLANTED, "srt.planted")) == sorted(
        sites_in(PLANTED, "srt.planted"))
    assert planted in census.unclassified(PROCESSES, live | {planted})


def test_every_frontend_that_serves_requests_is_classified_present_or_refused():
    """Where a request, a control call or an output is handled, vradix runs or the launch is refused: the scheduler,
    every HTTP and gRPC frontend, every tokenizer worker."""
    frontends = [name for name in PROCESSES if any(k in name for k in (
        "run_scheduler_process", "mp.Process(target)", "SchedulerActor", "http_server:", "grpc", "rust_server",
        "read_from_shared_memory", "encoder"))]
    assert len(frontends) >= 15
    assert {PROCESSES[name].class_ for name in frontends} <= {"vradix present", "refused"}, frontends
