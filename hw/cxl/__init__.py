"""CXL side of the device: message layouts and opcodes, the CXL.mem endpoint."""
