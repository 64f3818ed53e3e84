#pragma once
/// The ebpf differ: what the maps hold × what the plan wants → element writes, in an order
/// that never shows the data path a half-written service.
///
/// BPF maps have no transactions: each element is written alone, and a connect may look a
/// service up between any two writes. So the operations go in four phases:
///   1. slots added or changed (a slot nobody counts yet is invisible; a changed one holds a
///      wanted endpoint from then on);
///   2. services added or changed: the counts now cover slots that are all written;
///   3. services deleted: nothing looks their slots up any more;
///   4. slots deleted: past every count that is still in the map.
/// Within a phase, elements go in key order. A pass that fails between two writes leaves a
/// state that is still whole (it stopped between phases, or inside one whose every prefix is
/// whole), and the next sync is full and repairs the rest.
///
/// Thread-safety: pure functions.

#include <vector>

#include "kproxy/ebpf/maps.h"
#include "kproxy/ebpf/renderer.h"

namespace kproxy::ebpf {

/// The writes that make `current` into `desired`; none when they are equal.
std::vector<MapOp> diffMaps(const MapContents& current, const MapContents& desired);

/// What diffMaps(empty maps, the union of `ports`) writes, without building the union: every
/// slot of every port, then every service element (phases 1 and 2), port after port in the
/// order given. The first sync of a node whose maps are empty: at 100,000 service ports of 10
/// endpoints the union is 1.1 million tree nodes that nothing else needs. A key two ports share
/// is written once per port, the later port's value last, as the union keeps it.
std::vector<MapOp> fillEmptyMaps(const std::vector<const PortMaps*>& ports);

/// Adds one service port's elements to `contents`.
void addPortMaps(MapContents& contents, const PortMaps& port);

/// The contents after `ops`, as a kernel that applied them all would hold them.
void applyOps(MapContents& contents, const std::vector<MapOp>& ops);

}  // namespace kproxy::ebpf
