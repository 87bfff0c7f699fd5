"""schemathesis against `sandcell serve`'s own /openapi.json: requests generated from the
document, with a valid token, at a real server with a real session; none may answer 5xx.
Each generated request is sent twice: as generated (ids that name nothing), and aimed at a
live session, so the bodies reach the routes' real work (uploads, cells, messages).

The operations are driven with hypothesis directly (schemathesis's pytest plugin does not
load under pytest 9)."""

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from tests.scripted_server import ScriptedServer
from tests.serve_helpers import ALICE, client, config, serving

AUTH = {"Authorization": f"Bearer {ALICE}"}
EXAMPLES = 15  # per operation: about 20 operations, each request a real one


@pytest.mark.docker
@pytest.mark.timeout(900)
def test_no_generated_request_gets_a_server_error(tmp_path):
    with (
        ScriptedServer() as model,  # no replies: each question ends with the model's error
        serving(config(model, tmp_path / "data", max_sessions=64)) as base,
        client(base) as api,
    ):
        sid = api.post("/api/sessions").json()["id"]
        schema = schemathesis.openapi.from_url(f"{base}/openapi.json")
        operations = [result.ok() for result in schema.get_all_operations()]
        assert len(operations) >= 10, operations  # the document names every route
        failures = []

        def send(case) -> None:
            response = case.call(base_url=base, headers=AUTH, timeout=120)  # a loaded machine
            if response.status_code >= 500:
                failures.append((case.as_curl_command(), response.status_code, response.text[:300]))

        for operation in operations:

            @given(case=operation.as_strategy())
            @settings(
                max_examples=EXAMPLES,
                deadline=None,
                suppress_health_check=list(HealthCheck),  # a real server behind: slow by design
                derandomize=True,  # the same requests every run
                database=None,
            )
            def check(case) -> None:
                send(case)
                if "id" in (case.path_parameters or {}) and case.method.upper() != "DELETE":
                    case.path_parameters["id"] = sid  # deleting it would end the run
                    send(case)

            check()
        assert not failures, failures[:5]
        assert api.get(f"/api/sessions/{sid}").status_code == 200  # still there, still answering
