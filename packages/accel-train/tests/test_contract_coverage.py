"""Every registered strategy is in the backend contract suite, or says where its cases run instead.

The contract tests (planted pickles, killed saves, exact resume) are parametrized over the table in
``cpu_backends``; a strategy registered without an entry there would silently miss all of them.
"""

from __future__ import annotations

from cpu_backends import CPU_BACKENDS, NOT_IN_THE_TABLE

from accel_train.strategies import STRATEGIES, strategy_class


def test_every_registered_strategy_is_in_the_contract_table_or_named_with_its_reason() -> None:
    in_table = {backend.strategy for backend in CPU_BACKENDS}
    missing = sorted(set(STRATEGIES) - in_table - set(NOT_IN_THE_TABLE))
    assert not missing, f"registered strategies without contract cases: {missing} (add them to cpu_backends.py)"
    assert not in_table & set(NOT_IN_THE_TABLE), "a strategy is both in the table and excused from it"
    assert in_table <= set(STRATEGIES), f"the table names unregistered strategies: {sorted(in_table - set(STRATEGIES))}"


def test_only_strategies_whose_model_is_whole_on_every_process_let_the_main_process_save_alone() -> None:
    alone = {name for name in STRATEGIES if name != "xla" and strategy_class(name).main_process_saves_alone}
    assert alone == {"single_device", "ddp"}
    for name in ("fsdp", "deepspeed", "nd_parallel", "pipeline"):
        assert strategy_class(name).is_sharded and not strategy_class(name).main_process_saves_alone


def test_each_backend_row_names_its_strategy_and_no_two_rows_claim_a_distributed_type() -> None:
    from accel_train.strategies import BACKENDS

    claimed: dict = {}
    for backend in BACKENDS:
        assert strategy_class(backend.name).name == backend.name
        for distributed_type in backend.distributed_types:
            assert distributed_type not in claimed, f"{distributed_type} claimed by {claimed.get(distributed_type)}"
            claimed[distributed_type] = backend.name
