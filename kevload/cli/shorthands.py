"""The options that set scenario keys, in one table: which keys each sets, and the ones that are
shorthands for a --set (``--retries N`` is ``--set load.retries=N``). Given with a --set or --grid
of the same key, both are refused."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from kevload.errors import InputError

# Each option that sets scenario keys, with the keys it sets (run's, sweep's; --target: its server's
# URL and model, once the server is up).
KEYS_OF: Mapping[str, tuple[str, ...]] = {
    "--url": ("target.base_url",),
    "--model": ("target.model",),
    "--prompt": ("probes",),
    "--target": ("target.base_url", "target.model"),
    "--server-cmd": ("target.base_url",),
    "--retries": ("load.retries",),
    "--dataset-seed": ("load.dataset_seed",),
    "--until-bound": ("load.until_bound",),
    "--workers": ("load.workers",),
}
# The shorthands: the option's value becomes its key's, as a --set would give it.
OVERRIDES = ("--retries", "--dataset-seed", "--until-bound", "--workers")


def set_keys(overrides: Iterable[str]) -> list[tuple[str, str]]:
    """Each ``--set KEY=VALUE`` as (how it was given, KEY); a malformed one is refused where it is
    applied."""
    return [(f"--set {key}", key) for key in (o.partition("=")[0].strip() for o in overrides)]


def refuse_set_twice(sets: list[tuple[str, str]], given: Mapping[str, object]) -> None:
    """An option that sets a scenario key (``given``: each option of ``KEYS_OF``, its value or None
    when not given) given with a --set or --grid of that key or of a table around or inside it
    (``sets``: how, the key) is bad usage: one of the two would be dropped without a word, the run
    sent somewhere or something else than the command line says."""
    for option, value in given.items():
        for key in KEYS_OF[option] if value is not None else ():
            for how, other in sets:
                if other == key or key.startswith(other + ".") or other.startswith(key + "."):
                    raise InputError(f"{option} and {how} both set {key}: give one of them")


def as_overrides(given: Mapping[str, object]) -> tuple[str, ...]:
    """The shorthands given (``given``: option → value, None when not given) as the --set each
    stands for."""
    return tuple(
        f"{KEYS_OF[option][0]}={value!r}"
        for option, value in given.items()
        if option in OVERRIDES and value is not None
    )
