"""Profile configuration and the validation of what a user asks for."""

import pytest
from tornado import web

from spawner.profiles import DEFAULT_PROFILES, ProfileConfigError, choose_profile, load_profiles

PROFILES = load_profiles(DEFAULT_PROFILES + [
    {"slug": "staff", "display_name": "Staff GPUs", "image": "img", "gpus": 2, "groups": ["staff"]},
])


def test_empty_options_choose_the_default_or_first_allowed_profile():
    assert choose_profile({}, PROFILES, []).slug == "tf-cpu"
    assert choose_profile(None, PROFILES, [], default_slug="tf-gpu-1").slug == "tf-gpu-1"


def test_a_valid_choice_returns_that_profile():
    profile = choose_profile({"profile": "tf-gpu-1"}, PROFILES, [])
    assert (profile.slug, profile.gpus) == ("tf-gpu-1", 1)


@pytest.mark.parametrize("options, status, fragment", [
    ([], 400, "JSON object"),
    ("tf-cpu", 400, "JSON object"),
    ({"profile": None, "image": "x"}, 400, "'image'"),
    ({"profile": "tf-cpu", "environment": {}}, 400, "'environment'"),
    ({"profile": ["tf-cpu"]}, 400, "must be a string"),
    ({"profile": "nope"}, 400, "Unknown profile 'nope'"),
    ({"profile": "staff"}, 403, "staff"),
])
def test_bad_options_are_refused_with_a_clear_message(options, status, fragment):
    with pytest.raises(web.HTTPError) as err:
        choose_profile(options, PROFILES, ["students"])
    assert err.value.status_code == status
    assert fragment in err.value.log_message


def test_hostile_profile_names_are_not_echoed_whole():
    hostile = "x" * 10_000 + "\x00\x1b[31m"
    with pytest.raises(web.HTTPError) as err:
        choose_profile({"profile": hostile}, PROFILES, [])
    assert len(err.value.log_message) < 200
    assert "\x00" not in err.value.log_message and "\x1b" not in err.value.log_message


def test_group_profiles_are_for_members_only():
    assert choose_profile({"profile": "staff"}, PROFILES, ["staff"]).gpus == 2


@pytest.mark.parametrize("bad", [
    [],
    [{"slug": "a", "display_name": "A"}],  # no image
    [{"slug": "a", "display_name": "A", "image": "i", "gpus": -1}],
    [{"slug": "a", "display_name": "A", "image": "i", "gpus": True}],
    [{"slug": "a", "display_name": "A", "image": "i", "cpu_limit": 0}],
    [{"slug": "a", "display_name": "A", "image": "i", "groups": "staff"}],
    [{"slug": "a", "display_name": "A", "image": "i", "volumes": {}}],
    [{"slug": "a", "display_name": "A", "image": "i"}, {"slug": "a", "display_name": "B", "image": "j"}],
])
def test_malformed_profile_config_is_an_admin_error(bad):
    with pytest.raises(ProfileConfigError):
        load_profiles(bad)
