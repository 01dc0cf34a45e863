"""DeviceConfig validation, presets and the generator CLI (fast tier)."""

from __future__ import annotations

import pytest

from hw.config import DeviceConfig, load_config, preset_names
from hw.gen import main as gen_main


def test_presets_load():
    names = preset_names()
    assert {"default", "small", "odd"} <= set(names)
    for name in names:
        config = load_config(name)
        assert config.name == name
        assert config.line_bits == 512


def test_dataclass_defaults_are_the_default_preset():
    # Both build a module named tcxl_device_default, so they must be one device.
    assert DeviceConfig() == load_config("default")


def test_default_config_reaches_pmem_peak():
    # 120-cycle PMEM latency at one line per cycle needs > 120 requests in flight.
    assert load_config("default").max_tags >= 128


POW2_MSG = "pmem_size must be a power of two between 64 KiB and 64 TiB"
HDM_MSG = "hdm_size must be a 4 KiB multiple no larger than pmem_size (1073741824)"


@pytest.mark.parametrize(("change", "message"), [
    ({"name": "Bad-Name"}, "name must match [a-z][a-z0-9_]*, not 'Bad-Name'"),
    ({"line_bits": 256}, "line_bits is fixed at 512, not 256"),
    ({"pmem_size": 3 << 20}, f"{POW2_MSG}, not 3145728"),
    ({"pmem_size": 1 << 12, "hdm_size": 0}, f"{POW2_MSG}, not 4096"),
    ({"hdm_base": 0x1001}, "hdm_base must be a 4 KiB aligned 52-bit address, not 0x1001"),
    ({"hdm_size": 1 << 31}, f"{HDM_MSG}, not 2147483648"),
    ({"hdm_size": 4097}, f"{HDM_MSG}, not 4097"),
    ({"hdm_base": (1 << 52) - 4096}, "hdm_base + hdm_size must stay below 2**52"),
    ({"max_tags": 0}, "max_tags must be between 1 and 4096, not 0"),
    ({"axi_id_width": 5}, "axi_id_width must be between 6 and 16, not 5"),
    ({"engine_lanes": 12}, "engine_lanes must be 4, 8 or 16, not 12"),
    ({"reduce_partials": 0}, "reduce_partials must be between 1 and 8, not 0"),
    ({"gather_rob_lines": 48}, "gather_rob_lines must be a power of two between 16 and 4096"),
    ({"engine_max_dim": 40}, "engine_max_dim must be a multiple of 16 between 16 and 1024"),
    ({"engine_max_dim": 2048}, "engine_max_dim must be a multiple of 16 between 16 and 1024"),
    ({"update_acc_rows": 1}, "update_acc_rows must be a power of two between 2 and 4096"),
    ({"update_acc_lines": 8}, "update_acc_lines must be a power of two between engine_max_dim"),
    ({"update_acc_lines": 3 << 10}, "update_acc_lines must be a power of two between"),
    ({"update_max_passes": 3}, "update_max_passes must be a power of two between 1 and 65536"),
    ({"update_max_passes": 0}, "update_max_passes must be a power of two between 1 and 65536"),
    ({"ckpt_filter_rows": 3}, "ckpt_filter_rows must be a power of two between 2 and 4096"),
    ({"ckpt_fifo_lines": 1}, "ckpt_fifo_lines must be between 2 and 4096, not 1"),
    ({"mlp_relax_k": -1}, "mlp_relax_k must be between 0 and 65535, not -1"),
    ({"engine_sequencers": 0}, "engine_sequencers must be between 1 and 8"),
    ({"seq_replay_lines": 1}, "seq_replay_lines must be 0 or a power of two"),
    ({"seq_replay_lines": 24}, "seq_replay_lines must be 0 or a power of two"),
    ({"seq_replay_lines": 8192}, "seq_replay_lines must be 0 or a power of two"),
    ({"row_store_lines": 1}, "row_store_lines must be 0 or a power of two"),
    ({"row_store_lines": 48}, "row_store_lines must be 0 or a power of two"),
    ({"row_store_lines": 1 << 17}, "row_store_lines must be 0 or a power of two"),
    ({"engine_sequencers": 9}, "engine_sequencers must be between 1 and 8"),
    ({"axi_id_width": 6, "max_tags": 64, "engine_sequencers": 3},
     "engine_sequencers must be between 1 and 8, with axi_id_width - 3"),
    ({"meta_state": 2}, "meta_state must be 0 or 1, not 2"),
    ({"meta_state": 1}, "meta_state needs 2 bits per line on chip: at most 1048576 lines "
                        "(64 MiB of pmem_size), not 16777216"),
    ({"max_tags": 300}, "axi_id_width 8 gives 256 IDs, fewer than max_tags 300"),
    ({"hazard_buckets": 12}, "hazard_buckets must be a power of two between 2 and 4096, not 12"),
    ({"csr_addr_width": 8}, "csr_addr_width must be between 12 and 24, not 8"),
    ({"max_tags": "64"}, "max_tags must be an integer, not '64'"),
    ({"max_tags": True}, "max_tags must be an integer, not True"),
])
def test_validation_names_the_bad_value(change, message):
    with pytest.raises(ValueError) as info:
        DeviceConfig(**change)
    assert message in str(info.value)


def test_unknown_toml_key_is_rejected(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("max_tagz = 4\n")
    with pytest.raises(ValueError, match=r"unknown config key\(s\) max_tagz"):
        load_config(path)


def test_missing_preset_lists_presets():
    with pytest.raises(ValueError, match=r"config 'nope' not found \(presets: .*default"):
        load_config("nope")


def test_derived_values():
    config = load_config("small")
    assert config.pmem_addr_width == 16
    assert config.pmem_lines == 1024
    assert config.tag_index_width == 2
    assert list(config.params()) == [
        "line_bits", "pmem_size", "hdm_base", "hdm_size", "max_tags", "axi_id_width",
        "hazard_buckets", "csr_addr_width", "engine_lanes", "reduce_partials",
        "gather_rob_lines", "engine_max_dim", "update_acc_rows", "update_acc_lines",
        "ckpt_filter_rows",
        "ckpt_fifo_lines", "mlp_relax_k", "page_bytes", "dcoh_cqids", "cache_cqids",
        "cache_write_cqids", "engine_sequencers", "meta_state", "seq_replay_lines",
        "row_store_lines", "update_max_passes"]
    assert config.dcoh_pages == 16
    assert config.log_slot_lines == 5
    assert config.pmem_id_width == 7
    assert config.engine_max_lines == 4


def test_gen_cli_emits_named_modules(tmp_path):
    assert gen_main(["--config", "small", "--design", "mem_endpoint", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "small" / "tcxl_mem_endpoint_small.v").read_text()
    assert "module tcxl_mem_endpoint_small(" in text


def test_gen_cli_reports_bad_config(tmp_path, capsys):
    assert gen_main(["--config", "nope", "--out", str(tmp_path)]) == 2
    assert "config 'nope' not found" in capsys.readouterr().err


@pytest.mark.parametrize("lines", [0, 16])
def test_row_store_lines_zero_builds_none(lines):
    """``row_store_lines = 0`` builds an engine without the row store and its reader
    (the scatter reads every row from PMEM); a non-zero value builds both."""
    from amaranth.hdl import Fragment

    from hw.engine.engine import Engine

    config = load_config("small").replace(row_store_lines=lines)
    fragment = Fragment.get(Engine(config=config), None)
    names = {name for _, name, *_ in fragment.subfragments}
    assert ("row_store" in names) == bool(lines), sorted(names)
    assert ("store_reader" in names) == bool(lines), sorted(names)
