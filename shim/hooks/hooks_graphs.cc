// hooks_graphs: the driver's graph hooks (graph_ranges.h). A memcpy node
// never copies through a deferred registration.
#include "driver_hook.h"  // first: cuda.h's names as the driver exports them

#include <string.h>

#include "copy_sides.h"
#include "graph_ranges.h"
#include "pages.h"

using namespace lazypin;  // NOLINT: the hooks below are C symbols

// ---- graphs: a memcpy node never copies through a deferred registration ----
// (graph_ranges.h; docs/design.md, "Graphs"). Each memcpy node's host ranges
// are noted for its graph (explicit nodes here, captured copies by the copy
// hooks in hooks_copies.cc), carried to the executable graphs made from it,
// and released from the pool before the graph is instantiated or launched.
namespace lazypin {
void NoteGraphRange(Dispatch* dispatch, const void* owner, uintptr_t lo, uintptr_t hi) {
  if (hi <= lo) return;
  {
    ScopedInsideLazypin inside;
    if (owner != nullptr) {
      Graphs().Add(owner, {lo, hi});
    } else {
      Graphs().AddStray({lo, hi});
    }
  }
  dispatch->BeforeGraphUse(lo, hi);
}
}  // namespace lazypin

namespace {

// A memcpy node of `owner` (null: a node whose graph is unknown).
void NoteGraphCopy(const void* owner, const CUDA_MEMCPY3D* copy) {
  Dispatch* dispatch = DeferringDispatch();
  CopySide dst, src;
  if (dispatch == nullptr || !Sides3D(copy, &dst, &src)) return;
  NoteGraphRange(dispatch, owner, dst.lo, RangeEnd(dst.lo, dst.bytes));
  NoteGraphRange(dispatch, owner, src.lo, RangeEnd(src.lo, src.bytes));
}
void NoteGraphNode(const void* owner, const CUgraphNodeParams* params) {
  if (params != nullptr && params->type == CU_GRAPH_NODE_TYPE_MEMCPY) {
    NoteGraphCopy(owner, &params->memcpy.copyParams);
  }
}

// `owner` (a graph about to be instantiated, an executable graph about to be
// launched) may copy its ranges now: release what the pool defers there.
void BeforeGraphRuns(const void* owner) {
  if (!Graphs().Any() || t_state.inside) return;
  Dispatch* dispatch = DeferringDispatch();
  if (dispatch == nullptr || dispatch->pool()->Empty()) return;  // nothing deferred anywhere
  std::vector<GraphRanges::Range> ranges;
  {
    ScopedInsideLazypin inside;
    Graphs().ForEach(owner, [&](GraphRanges::Range r) { ranges.push_back(r); });
  }
  for (const GraphRanges::Range& r : ranges) dispatch->BeforeGraphUse(r.lo, r.hi);
}

void CopyGraphRanges(CUresult result, const void* from, const void* to) {
  if (result != CUDA_SUCCESS || to == nullptr || !Graphs().Any() || t_state.inside) return;
  ScopedInsideLazypin inside;
  Graphs().CopyTo(from, to);
}

void ForgetGraph(CUresult result, const void* owner) {
  if (result != CUDA_SUCCESS || !Graphs().Any() || t_state.inside) return;
  ScopedInsideLazypin inside;
  Graphs().Forget(owner);
}

}  // namespace

HOOK(cuGraphAddMemcpyNode, CUresult, DriverSymbol, (CUgraphNode*, node), (CUgraph, graph),
     (const CUgraphNode*, deps), (size_t, count), (const CUDA_MEMCPY3D*, copy), (CUcontext, ctx)) {
  NoteGraphCopy(graph, copy);
  return real(node, graph, deps, count, copy, ctx);
}
HOOK(cuGraphAddNode, CUresult, DriverSymbol, (CUgraphNode*, node), (CUgraph, graph),
     (const CUgraphNode*, deps), (size_t, count), (CUgraphNodeParams*, params)) {
  NoteGraphNode(graph, params);
  return real(node, graph, deps, count, params);
}
HOOK(cuGraphAddNode_v2, CUresult, DriverSymbol, (CUgraphNode*, node), (CUgraph, graph),
     (const CUgraphNode*, deps), (const CUgraphEdgeData*, edges), (size_t, count),
     (CUgraphNodeParams*, params)) {
  NoteGraphNode(graph, params);
  return real(node, graph, deps, edges, count, params);
}
HOOK(cuGraphMemcpyNodeSetParams, CUresult, DriverSymbol, (CUgraphNode, node),
     (const CUDA_MEMCPY3D*, copy)) {
  NoteGraphCopy(nullptr, copy);
  return real(node, copy);
}
HOOK(cuGraphNodeSetParams, CUresult, DriverSymbol, (CUgraphNode, node), (CUgraphNodeParams*, params)) {
  NoteGraphNode(nullptr, params);
  return real(node, params);
}
HOOK(cuGraphExecMemcpyNodeSetParams, CUresult, DriverSymbol, (CUgraphExec, exec), (CUgraphNode, node),
     (const CUDA_MEMCPY3D*, copy), (CUcontext, ctx)) {
  NoteGraphCopy(exec, copy);
  return real(exec, node, copy, ctx);
}
HOOK(cuGraphExecNodeSetParams, CUresult, DriverSymbol, (CUgraphExec, exec), (CUgraphNode, node),
     (CUgraphNodeParams*, params)) {
  NoteGraphNode(exec, params);
  return real(exec, node, params);
}
HOOK(cuGraphAddChildGraphNode, CUresult, DriverSymbol, (CUgraphNode*, node), (CUgraph, graph),
     (const CUgraphNode*, deps), (size_t, count), (CUgraph, child)) {
  const CUresult result = real(node, graph, deps, count, child);
  CopyGraphRanges(result, child, graph);
  return result;
}
HOOK(cuGraphClone, CUresult, DriverSymbol, (CUgraph*, clone), (CUgraph, original)) {
  const CUresult result = real(clone, original);
  CopyGraphRanges(result, original, clone != nullptr ? *clone : nullptr);
  return result;
}
HOOK(cuGraphInstantiateWithFlags, CUresult, DriverSymbol, (CUgraphExec*, exec), (CUgraph, graph),
     (unsigned long long, flags)) {
  BeforeGraphRuns(graph);
  const CUresult result = real(exec, graph, flags);
  CopyGraphRanges(result, graph, exec != nullptr ? *exec : nullptr);
  return result;
}
#define INSTANTIATE_WITH_PARAMS_HOOK(NAME)                                                      \
  HOOK(NAME, CUresult, DriverSymbol, (CUgraphExec*, exec), (CUgraph, graph),                    \
       (CUDA_GRAPH_INSTANTIATE_PARAMS*, params)) {                                              \
    BeforeGraphRuns(graph);                                                                     \
    const CUresult result = real(exec, graph, params);                                          \
    CopyGraphRanges(result, graph, exec != nullptr ? *exec : nullptr);                          \
    return result;                                                                              \
  }
INSTANTIATE_WITH_PARAMS_HOOK(cuGraphInstantiateWithParams)
INSTANTIATE_WITH_PARAMS_HOOK(cuGraphInstantiateWithParams_ptsz)
HOOK(cuGraphExecUpdate_v2, CUresult, DriverSymbol, (CUgraphExec, exec), (CUgraph, graph),
     (CUgraphExecUpdateResultInfo*, info)) {
  const CUresult result = real(exec, graph, info);
  CopyGraphRanges(result, graph, exec);
  return result;
}
HOOK(cuGraphLaunch, CUresult, DriverSymbol, (CUgraphExec, exec), (CUstream, stream)) {
  BeforeGraphRuns(exec);
  return real(exec, stream);
}
HOOK(cuGraphLaunch_ptsz, CUresult, DriverSymbol, (CUgraphExec, exec), (CUstream, stream)) {
  BeforeGraphRuns(exec);
  return real(exec, stream);
}
HOOK(cuGraphDestroy, CUresult, DriverSymbol, (CUgraph, graph)) {
  const CUresult result = real(graph);
  ForgetGraph(result, graph);
  return result;
}
HOOK(cuGraphExecDestroy, CUresult, DriverSymbol, (CUgraphExec, exec)) {
  const CUresult result = real(exec);
  ForgetGraph(result, exec);
  return result;
}

HOOK_TABLE(GraphHooks,
    ENTRY(cuGraphAddMemcpyNode, "cuGraphAddMemcpyNode", 10000, INT_MAX),
    ENTRY(cuGraphAddNode, "cuGraphAddNode", 12020, 12029),
    ENTRY(cuGraphAddNode_v2, "cuGraphAddNode", 12030, INT_MAX),
    ENTRY(cuGraphMemcpyNodeSetParams, "cuGraphMemcpyNodeSetParams", 10000, INT_MAX),
    ENTRY(cuGraphNodeSetParams, "cuGraphNodeSetParams", 12020, INT_MAX),
    ENTRY(cuGraphExecMemcpyNodeSetParams, "cuGraphExecMemcpyNodeSetParams", 10020, INT_MAX),
    ENTRY(cuGraphExecNodeSetParams, "cuGraphExecNodeSetParams", 12020, INT_MAX),
    ENTRY(cuGraphAddChildGraphNode, "cuGraphAddChildGraphNode", 10000, INT_MAX),
    ENTRY(cuGraphClone, "cuGraphClone", 10000, INT_MAX),
    ENTRY(cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags", 11040, INT_MAX),
    ENTRY(cuGraphInstantiateWithFlags, "cuGraphInstantiate", 12000, INT_MAX),
    ENTRY_FOR(cuGraphInstantiateWithParams, "cuGraphInstantiateWithParams", 12000, INT_MAX, kLegacy),
    ENTRY_FOR(cuGraphInstantiateWithParams_ptsz, "cuGraphInstantiateWithParams", 12000, INT_MAX,
              kPerThread),
    ENTRY(cuGraphExecUpdate_v2, "cuGraphExecUpdate", 12000, INT_MAX),
    ENTRY_FOR(cuGraphLaunch, "cuGraphLaunch", 10000, INT_MAX, kLegacy),
    ENTRY_FOR(cuGraphLaunch_ptsz, "cuGraphLaunch", 10000, INT_MAX, kPerThread),
    ENTRY(cuGraphDestroy, "cuGraphDestroy", 10000, INT_MAX),
    ENTRY(cuGraphExecDestroy, "cuGraphExecDestroy", 10000, INT_MAX))
