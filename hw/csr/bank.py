"""The CSR bank: an AXI4-Lite subordinate generated from the register description."""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..bus.axi import AXI4LiteSignature, AxiResp
from ..config import DeviceConfig
from .registers import DATA_WIDTH, Kind, RegisterMap, register_map

__all__ = ["CsrBank"]


def _or_tree(values: list) -> Value:
    """The OR of ``values`` as a balanced tree (a chain of 145 ORs is too deep for the
    Amaranth simulator's recursion); 0 for none."""
    if not values:
        return Const(0, DATA_WIDTH)
    while len(values) > 1:
        values = [values[i] | values[i + 1] if i + 1 < len(values) else values[i]
                  for i in range(0, len(values), 2)]
    return Value.cast(values[0])


class CsrBank(wiring.Component):
    """AXI4-Lite register bank built from a :class:`~hw.csr.registers.RegisterMap`.

    Every register of the map becomes storage, read and write decoding and the hardware
    ports its kind calls for (see :mod:`hw.csr.registers`); the map is the only place
    where offsets, widths and reset values are written down.

    Read and write paths are independent and each holds one transaction at a time. A
    write waits until both AW and W have been accepted (in either order, or in the same
    cycle); it is performed in the cycle after the later handshake, and its effect and
    ``bvalid`` are visible the cycle after that. The next AW and W are accepted once the
    B response has been taken (3 cycles per write without backpressure). A read is
    accepted when no R response is pending; the register is sampled in the cycle after
    the AR handshake and ``rvalid`` rises the cycle after that (3 cycles per read).
    ``awready``, ``wready`` and ``arready`` depend only on the bank's own flip-flops, and
    ``bvalid``/``rvalid`` with their payloads are flip-flops held until
    ``bready``/``rready``, so no combinational path crosses the port and backpressure
    never changes a response.

    Responses: OKAY for a decoded, 4-byte aligned address, SLVERR otherwise (an unmapped
    read returns 0; an unmapped write changes nothing). Writes to read-only kinds (CONST,
    RO, CAPTURE, COUNTER64) are ignored with OKAY; reads of PULSE registers return 0.
    WSTRB is honoured per byte for RW, W1C and PULSE registers. ``awprot``/``arprot``
    are ignored.

    Hardware side: RW values, W1C flags and PULSE strobes are registered outputs. An RW
    register's new value is on its port the cycle after the write (the cycle ``bvalid``
    rises). A W1C ``_set`` pulse is visible in the register the following cycle; a set
    and a software clear of the same bit in one cycle leave it set. A PULSE port carries
    the written value for exactly that one cycle, and the COUNTER64s it clears read 0
    from the same cycle (clear wins over an increment in the write cycle). A COUNTER64
    counts ``_inc`` one cycle later; reading its ``_LO`` word loads the upper 32 bits
    into a snapshot that the ``_HI`` word returns, so a ``_LO`` then ``_HI`` read pair is
    consistent across a carry.

    Reset: every register returns to its ``reset`` value; counters and snapshots to 0;
    no response is pending.

    Parameters
    ----------
    config:
        The :class:`~hw.config.DeviceConfig`; gives ``csr_addr_width``.
    registers:
        The register map (default ``register_map(config)``); it must fit in
        ``2**config.csr_addr_width`` bytes.

    Members
    -------
    csr: ``In(AXI4LiteSignature(addr_width=config.csr_addr_width))``
        The AXI4-Lite subordinate port.
    <register ports>:
        One member per :class:`~hw.csr.registers.Port` of the map (``registers.ports``),
        for example ``hdm_base_lo``, ``err_status_set``, ``perf_cycles_inc``. The value
        ports of a register with fields have its field layout
        (:attr:`~hw.csr.registers.Register.layout`): the device connects them by field
        name (``eng_status.in_flight``, ``coh_ctrl.hdm_d``), so adding a status bit is
        one edit of the register map and one connection.

    Raises
    ------
    TypeError
        If ``config`` is not a DeviceConfig or ``registers`` not a RegisterMap.
    ValueError
        If the map does not fit in the config's CSR space, or a port name clashes with
        an attribute of the component.
    """

    def __init__(self, *, config: DeviceConfig, registers: RegisterMap | None = None):
        if not isinstance(config, DeviceConfig):
            raise TypeError(f"config must be a DeviceConfig, not {config!r}")
        if registers is None:
            registers = register_map(config)
        if not isinstance(registers, RegisterMap):
            raise TypeError(f"registers must be a RegisterMap, not {registers!r}")
        space = 1 << config.csr_addr_width
        for reg in registers:
            if reg.end > space:
                raise ValueError(
                    f"register {reg.name} at {reg.offset:#x} does not fit in the "
                    f"{config.csr_addr_width}-bit CSR space of config {config.name}")
            for port in reg.ports:
                if hasattr(type(self), port.name):
                    raise ValueError(f"register {reg.name}: port name {port.name} clashes "
                                     f"with an attribute of CsrBank")
        self._config = config
        self._registers = registers
        members = {"csr": In(AXI4LiteSignature(addr_width=config.csr_addr_width))}
        for port in registers.ports:
            if port.direction == "in":
                members[port.name] = In(port.shape)
            else:
                members[port.name] = Out(port.shape, init=port.init_value)
        super().__init__(members)

    config = property(lambda self: self._config)
    registers = property(lambda self: self._registers)

    def elaborate(self, platform):
        m = Module()
        # The register ports as plain bits (ports of registers with fields are views).
        bits = lambda name: Value.cast(getattr(self, name))
        # COUNTER64 count registers by register name, kept for simulation test benches
        # that preload a count: a carry out of bit 31 takes 2**32 cycles otherwise.
        self._counts = {}
        bus = self.csr
        aw = self.config.csr_addr_width

        # --- write path: collect AW and W, then perform the write and answer on B ------
        aw_full = Signal()
        aw_addr = Signal(aw)
        w_full = Signal()
        w_data = Signal(DATA_WIDTH)
        w_strb = Signal(DATA_WIDTH // 8)

        m.d.comb += [
            bus.awready.eq(~aw_full & ~bus.bvalid),
            bus.wready.eq(~w_full & ~bus.bvalid),
        ]
        with m.If(bus.awvalid & bus.awready):
            m.d.sync += [aw_full.eq(1), aw_addr.eq(bus.awaddr)]
        with m.If(bus.wvalid & bus.wready):
            m.d.sync += [w_full.eq(1), w_data.eq(bus.wdata), w_strb.eq(bus.wstrb)]

        # `bvalid` is low whenever both halves are held (the readies above hold it off).
        wr_en = Signal()
        m.d.comb += wr_en.eq(aw_full & w_full)
        with m.If(wr_en):
            m.d.sync += [aw_full.eq(0), w_full.eq(0), bus.bvalid.eq(1)]
        with m.Elif(bus.bready):
            m.d.sync += bus.bvalid.eq(0)

        byte_mask = Signal(DATA_WIDTH)
        m.d.comb += byte_mask.eq(Cat(b.replicate(8) for b in w_strb))
        # Bits of the held write data that the strobes enable.
        w_bits = Signal(DATA_WIDTH)
        m.d.comb += w_bits.eq(w_data & byte_mask)

        # One strobe per address slot, high in the cycle its write is performed.
        wr_word = {w.name: Signal(name=f"wr_{w.name.lower()}") for w in self.registers.words}
        with m.If(wr_en), m.Switch(aw_addr):
            for w in self.registers.words:
                with m.Case(w.offset):
                    m.d.comb += wr_word[w.name].eq(1)
                    m.d.sync += bus.bresp.eq(AxiResp.OKAY)
            with m.Default():
                m.d.sync += bus.bresp.eq(AxiResp.SLVERR)

        # --- read path: decode the AR address at its handshake, then load R ------------
        # One flip-flop per word, set when the accepted address is the word's: the cycle
        # after the handshake selects the word's value with it (an AND-OR), instead of
        # decoding a held address there, which is the bank's longest path.
        ar_full = Signal()
        m.d.comb += bus.arready.eq(~ar_full & ~bus.rvalid)
        rd_word = {w.name: Signal(name=f"rd_{w.name.lower()}") for w in self.registers.words}
        rd_sel = {w.name: Signal(name=f"rd_sel_{w.name.lower()}") for w in self.registers.words}
        with m.If(bus.arvalid & bus.arready):
            m.d.sync += ar_full.eq(1)
            m.d.sync += [rd_sel[w.name].eq(bus.araddr[:aw] == w.offset)
                         for w in self.registers.words]
        with m.If(ar_full):
            m.d.sync += [ar_full.eq(0), bus.rvalid.eq(1)]
        with m.Elif(bus.rready):
            m.d.sync += bus.rvalid.eq(0)

        # --- registers -------------------------------------------------------------------
        read_value = {}     # word name -> value returned by a read
        w1c_next = {}       # W1C register name -> value after this cycle's software clear
        pulse_bit0 = {}     # PULSE register name -> bit 0 written 1 in this cycle

        for reg in self.registers:
            if reg.kind is Kind.W1C:
                value = bits(reg.port_name)
                clear = Mux(wr_word[reg.name], w_bits[:reg.width], 0)
                w1c_next[reg.name] = Signal(reg.width, name=f"{reg.port_name}_cleared")
                m.d.comb += w1c_next[reg.name].eq(value & ~clear)
                m.d.sync += value.eq(w1c_next[reg.name] | bits(f"{reg.port_name}_set"))
                read_value[reg.name] = value
            elif reg.kind is Kind.PULSE:
                pulse_bit0[reg.name] = Signal(name=f"{reg.port_name}_bit0")
                m.d.comb += pulse_bit0[reg.name].eq(wr_word[reg.name] & w_bits[0])
                m.d.sync += bits(reg.port_name).eq(
                    Mux(wr_word[reg.name], w_bits[:reg.width], 0))
                read_value[reg.name] = Const(0, reg.width)

        for reg in self.registers:
            name, port = reg.name, reg.port_name
            if reg.kind is Kind.CONST:
                read_value[name] = Const(reg.reset, reg.width)
            elif reg.kind is Kind.RW:
                value = bits(port)
                # Bits outside the writable mask are never assigned: they keep the reset
                # value (the port's init) and synthesis reduces them to constants.
                mask = Const(reg.write_mask, reg.width)
                with m.If(wr_word[name]):
                    m.d.sync += value.eq((value & ~(byte_mask[:reg.width] & mask)) |
                                         (w_bits[:reg.width] & mask))
                read_value[name] = value
            elif reg.kind is Kind.RO:
                read_value[name] = bits(port)
            elif reg.kind is Kind.CAPTURE:
                value = Signal(reg.width, init=reg.reset, name=f"{port}_q")
                armed = Const(1) if reg.armed_by is None else ~w1c_next[reg.armed_by].any()
                with m.If(bits(f"{port}_capture") & armed):
                    m.d.sync += value.eq(bits(f"{port}_value"))
                read_value[name] = value
            elif reg.kind is Kind.COUNTER64:
                count = self._counts[name] = Signal(64, name=f"{port}_count")
                snapshot = Signal(DATA_WIDTH, name=f"{port}_snapshot")
                lo, hi = reg.words
                with m.If(pulse_bit0[reg.clear_by]):
                    m.d.sync += count.eq(0)
                with m.Elif(bits(f"{port}_inc").any()):
                    m.d.sync += count.eq(count + bits(f"{port}_inc"))
                # A _LO read takes its snapshot even when a clear hits the same cycle, so
                # the _HI read that follows matches the _LO value software got.
                with m.If(rd_word[lo.name]):
                    m.d.sync += snapshot.eq(count[DATA_WIDTH:])
                with m.Elif(pulse_bit0[reg.clear_by]):
                    m.d.sync += snapshot.eq(0)
                read_value[lo.name] = count[:DATA_WIDTH]
                read_value[hi.name] = snapshot

        words = self.registers.words
        with m.If(ar_full):
            m.d.comb += [rd_word[w.name].eq(rd_sel[w.name]) for w in words]
            m.d.sync += [
                bus.rdata.eq(_or_tree([Mux(rd_sel[w.name], read_value[w.name], 0)
                                       for w in words])),
                bus.rresp.eq(Mux(Cat(rd_sel.values()).any(), AxiResp.OKAY, AxiResp.SLVERR)),
            ]

        return m
