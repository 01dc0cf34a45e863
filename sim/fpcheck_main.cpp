// Bulk-vector driver for one hw.arith unit, built by sim/fpcheck.py with
//   verilator --cc --exe --build --prefix Vtop <unit>.v fpcheck_main.cpp
//
// usage: fpcheck <in.bin> <out.bin> <seed> <valid_pct> <ready_pct>
//
// in.bin holds one little-endian uint64 per operation (a in bits 31:0, b in 63:32; the
// port keeps as many bits as it has); out.bin receives one uint32 per result, in
// order. Input idle cycles and output backpressure are drawn from a seeded xorshift64*
// generator: each cycle the source offers a new operand with probability valid_pct %
// and the sink is ready with probability ready_pct %. The sink checks the stream rules
// on o_result (once valid, valid and payload hold until the transfer); the source obeys
// them on i_operands. One line of key=value statistics goes to stdout:
//   cycles       cycles from the first input transfer to the last output transfer, both
//                included
//   latency      cycles from the first input transfer to the first o_result.valid
// Exit status: 0 ok, 2 usage or I/O error, 3 protocol violation, 4 timeout.

#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "Vtop.h"
#include "verilated.h"

// Verilator escapes the "__" of Amaranth's flattened port names as "___05F".
#define I_VALID i_operands___05Fvalid
#define I_READY i_operands___05Fready
#define I_PAYLOAD i_operands___05Fpayload
#define O_VALID o_result___05Fvalid
#define O_READY o_result___05Fready
#define O_PAYLOAD o_result___05Fpayload

namespace {

struct Rng {
    uint64_t state;
    explicit Rng(uint64_t seed) : state(seed ? seed : 0x9E3779B97F4A7C15ULL) {}
    uint64_t next() {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        return state * 0x2545F4914F6CDD1DULL;
    }
    bool chance(unsigned pct) { return pct >= 100 || (next() >> 32) % 100 < pct; }
};

// Cycles without any transfer before the run is declared hung.
constexpr uint64_t kTimeout = 100000;

}  // namespace

int main(int argc, char** argv) {
    if (argc != 6) {
        std::fprintf(stderr, "usage: %s in.bin out.bin seed valid_pct ready_pct\n", argv[0]);
        return 2;
    }
    const uint64_t seed = std::strtoull(argv[3], nullptr, 0);
    const unsigned valid_pct = static_cast<unsigned>(std::strtoul(argv[4], nullptr, 0));
    const unsigned ready_pct = static_cast<unsigned>(std::strtoul(argv[5], nullptr, 0));

    std::FILE* fin = std::fopen(argv[1], "rb");
    if (!fin) { std::perror(argv[1]); return 2; }
    std::vector<uint64_t> in;
    uint64_t word;
    while (std::fread(&word, sizeof word, 1, fin) == 1) in.push_back(word);
    std::fclose(fin);
    const uint64_t n = in.size();
    std::vector<uint32_t> out(n);

    auto context = std::make_unique<VerilatedContext>();
    auto top = std::make_unique<Vtop>(context.get());
    Rng rng(seed);

    auto tick = [&]() {
        top->clk = 1;
        top->eval();
        top->clk = 0;
        top->eval();
    };
    top->clk = 0;
    top->rst = 1;
    top->I_VALID = 0;
    top->O_READY = 0;
    top->eval();
    tick();
    tick();
    top->rst = 0;

    uint64_t sent = 0, received = 0, cycle = 0, last_progress = 0;
    int64_t first_in = -1, first_valid = -1, last_out = -1;
    bool offering = false, stalled = false;
    uint32_t stalled_payload = 0;
    while (received < n) {
        // Drive this cycle's inputs (the clock is low), then sample the handshakes.
        if (!offering && sent < n && rng.chance(valid_pct)) {
            top->I_PAYLOAD = in[sent];
            offering = true;
        }
        top->I_VALID = offering;
        top->O_READY = rng.chance(ready_pct);
        top->eval();

        const bool o_valid = top->O_VALID;
        const uint32_t o_payload = static_cast<uint32_t>(top->O_PAYLOAD);
        if (stalled && (!o_valid || o_payload != stalled_payload)) {
            std::fprintf(stderr, "cycle %" PRIu64 ": o_result %s while stalled\n", cycle,
                         o_valid ? "payload changed" : "valid dropped");
            return 3;
        }
        if (o_valid && first_valid < 0) first_valid = static_cast<int64_t>(cycle);
        if (offering && top->I_READY) {
            if (first_in < 0) first_in = static_cast<int64_t>(cycle);
            ++sent;
            offering = false;
            last_progress = cycle;
        }
        if (o_valid && top->O_READY) {
            out[received++] = o_payload;
            last_out = static_cast<int64_t>(cycle);
            last_progress = cycle;
        }
        stalled = o_valid && !top->O_READY;
        stalled_payload = o_payload;

        tick();
        ++cycle;
        if (cycle - last_progress > kTimeout) {
            std::fprintf(stderr, "timeout at cycle %" PRIu64 ": %" PRIu64 " sent, %" PRIu64
                         " received of %" PRIu64 "\n", cycle, sent, received, n);
            return 4;
        }
    }
    top->final();

    std::FILE* fout = std::fopen(argv[2], "wb");
    if (!fout || std::fwrite(out.data(), sizeof(uint32_t), n, fout) != n) {
        std::perror(argv[2]);
        return 2;
    }
    std::fclose(fout);
    std::printf("cycles=%" PRId64 " latency=%" PRId64 "\n",
                n ? last_out - first_in + 1 : 0, n ? first_valid - first_in : 0);
    return 0;
}
