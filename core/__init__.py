"""The ground floor: IR scalar types, capacities, the packed-table ABI and the error types.
Nothing here imports the rest of megavm; every other floor builds on it."""
