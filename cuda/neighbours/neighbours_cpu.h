// Edge counts of many structures at one cutoff (the sizes cfm-plan packs): the number of ordered
// atom pairs (i, j) closer than the cutoff, periodic images included, an atom's pair with itself
// left out (its pairs with its own images counted): the edge count of mace's neighbour list
// (matscipy's "ij" less the zero-shift self pairs), of vesin's full list, and of NequIP's.
//
// No torch headers: raw pointers and sizes (neighbours_ops.cpp is the binding layer).
#pragma once
#include <cstdint>

namespace cfm {
namespace neighbours {

// What count_edges_cpu writes for a structure it cannot count.
constexpr int64_t kDegenerateCell = -1;  // the periodic cell vectors span no volume (or area)
constexpr int64_t kTooManyImages = -2;   // the cutoff needs more than kMaxPoints images

// Images plus atoms one structure may need (a periodic cell far thinner than the cutoff).
constexpr int64_t kMaxPoints = 50000000;

// Structure s holds the atoms offsets[s]..offsets[s+1]-1 of positions ([N, 3], Cartesian), its
// cell cells[9 s..9 s+8] (row k = lattice vector k) and pbc[3 s..3 s+2] (1: periodic along lattice
// vector k; a non-periodic direction's cell row is not read). out[s] is its edge count, or one of
// the negative codes above. ``threads`` structures are counted at a time (OpenMP).
void count_edges_cpu(const double* positions, const int64_t* offsets, int64_t num_structures,
                     const double* cells, const uint8_t* pbc, double cutoff, int64_t* out,
                     int threads);

}  // namespace neighbours
}  // namespace cfm
