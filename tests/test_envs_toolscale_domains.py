"""ToolScale's ten domains as τ² environments, loaded from their folders by name or path.

Each domain builds its environment, lists its tools and runs one read tool on
the first record of its database; tau2's evaluator grades an episode of a
folder domain (it rebuilds the environment by name). Needs the `tau2` extra,
../shared/tau2-bench and ../shared/toolscale (skipped, saying which, without).
"""

import asyncio
import json
import shutil

import pytest

from orchestra_jax.data.tau2_tasks import tau2_task
from orchestra_jax.envs.tau2.domain_folder import TOOLSCALE_DOMAINS, check_domain_folder
from orchestra_jax.tools.base import ToolContext

# One read tool per domain: (tool, its id argument, the database table the id is from).
PROBES = {
    "bank": ("get_client_details", "client_id", "clients"),
    "basketball": ("get_club_details", "club_id", "clubs"),
    "ecommerce": ("get_sale_details", "sale_ref", "sales"),
    "medicine": ("get_patient_details", "patient_id", "patients"),
    "movie": ("get_movie_details", "movie_id", "movies"),
    "railway": ("get_user_details", "user_id", "users"),
    "restaurant": ("get_dish_details", "dish_ref", "menu_board"),
    "school": ("get_student_details", "student_id", "students"),
    "travel": ("get_package_details", "package_id", "packages"),
    "weather": ("get_location_details", "location_id", "locations"),
}


@pytest.fixture(scope="module")
def domains_dir(tau2_data, shared_file):
    return shared_file("toolscale/domains")


@pytest.fixture(scope="module")
def env(tau2_data, domains_dir):
    from orchestra_jax.envs.tau2.env import Tau2Environment, scripted_user_factory

    return Tau2Environment(scripted_user_factory, data_dir=tau2_data, domains_dir=domains_dir)


def probe_task(domain, actions=()):
    row = {
        "id": "probe",
        "user_scenario": {
            "instructions": {
                "domain": domain,
                "reason_for_call": "I have a question.",
                "known_info": "",
                "unknown_info": "",
                "task_instructions": "Ask it.",
            }
        },
        "evaluation_criteria": {"actions": list(actions), "reward_basis": ["DB"]},
    }
    return tau2_task(row, "test", source="toolscale")


def test_the_probe_table_covers_the_ten_domains():
    assert sorted(PROBES) == sorted(TOOLSCALE_DOMAINS)


@pytest.mark.parametrize("name", TOOLSCALE_DOMAINS)
def test_each_domain_builds_lists_its_tools_and_runs_one(env, domains_dir, name):
    from orchestra_jax.envs.tau2.tools import DomainTool

    tool_name, argument, table = PROBES[name]
    domain = env.domain_of(name)
    names = [t.name for t in domain.tools]
    assert tool_name in names and len(names) >= 10
    assert len(domain.policy) > 1000  # the folder's policy.md
    task = probe_task(name)
    episode = env.reset(task)
    tools = env.tools(env.tool_config_sampler(seed=0).sample(task), task=task)
    assert set(tools) == set(names)
    record_id = next(iter(json.loads((domains_dir / name / "db.json").read_text())[table]))
    result = asyncio.run(
        tools[tool_name]({argument: record_id}, ToolContext(task=task, state=episode))
    )
    assert result.error is None, result.text
    assert record_id in result.text
    missing = asyncio.run(
        tools[tool_name]({argument: "NO-SUCH-ID"}, ToolContext(task=task, state=episode))
    )
    assert missing.error and missing.text.startswith("Error")  # tau2's error semantics
    assert isinstance(DomainTool(domain.tools[0]).schema(), dict)


CANCEL = {"registration_id": "GO1ZSB7"}  # a registration of school's db.json, 2 courses


def test_a_domain_by_path_plays_tool_actions_and_tau2_grades_them_by_its_database(env, tau2_data):
    from orchestra_jax.envs.tau2.env import Tau2Environment
    from orchestra_jax.envs.tau2.user import ScriptedUser
    from tests.test_envs_tau2 import call, play

    folder = env._folder  # no domain given: tau2's own domains and the named ten
    assert folder is None
    by_path = Tau2Environment(
        lambda task, environment: ScriptedUser(["Please cancel my registration GO1ZSB7."]),
        data_dir=tau2_data,
        domain=str(env.domains_dir) + "/school",
    )
    assert by_path.domain == "school"
    with pytest.raises(FileNotFoundError, match="data.sources=toolscale"):
        by_path.tasks("base", 1)  # the folder has no tasks.json
    gold = [{"action_id": "cancel", "name": "cancel_registration", "arguments": CANCEL}]
    task = probe_task("school", gold)
    look = call("get_registration_details", CANCEL)
    done = "Your registration is cancelled."
    right = play(by_path, task, [look, call("cancel_registration", CANCEL), done])
    [read], [wrote] = (t.tool_results for t in right.turns[:2])
    assert read.error is None and '"ART-1101"' in read.text  # the folder's database
    assert (
        wrote.error is None and '"courses": []' in wrote.text and '"total_credits": 0' in wrote.text
    )
    assert right.metadata["grade"]["breakdown"] == {"DB": 1.0} and right.correct is True
    other = {"registration_id": "2ZLODR2"}  # cancels a registration, not the one asked
    wrong = play(by_path, task, [look, call("cancel_registration", other), done])
    assert wrong.turns[1].tool_results[0].error is None
    assert wrong.metadata["grade"]["breakdown"] == {"DB": 0.0} and wrong.correct is False
    idle = play(by_path, task, [look, done])  # reads only: the database is not the gold one
    assert idle.metadata["grade"]["breakdown"] == {"DB": 0.0} and idle.correct is False


def test_incomplete_and_clashing_folders_are_refused(env, tau2_data, domains_dir, tmp_path):
    from orchestra_jax.envs.tau2.domain_folder import register_domain_folder

    with pytest.raises(ValueError, match="nor a folder in env.tau2.domains_dir"):
        env.domain_of("no_such_domain")

    assert check_domain_folder(domains_dir / "bank") == []
    empty = tmp_path / "empty_domain"
    empty.mkdir()
    with pytest.raises(ValueError, match="has no db.json"):
        register_domain_folder(empty, tau2_data)
    retail = tmp_path / "retail"
    shutil.copytree(domains_dir / "school", retail)
    with pytest.raises(ValueError, match="one of tau2's own domains"):
        register_domain_folder(retail, tau2_data)
    twin = tmp_path / "twin" / "school"
    shutil.copytree(domains_dir / "school", twin)
    register_domain_folder(domains_dir / "school", tau2_data)
    with pytest.raises(ValueError, match="cannot be loaded in the same process"):
        register_domain_folder(twin, tau2_data)
