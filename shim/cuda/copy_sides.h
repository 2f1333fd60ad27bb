// copy_sides: the host memory one side of a driver copy can touch, from its
// parameters, defined once for every hook that needs it (the watch's changes
// applied before the copy, auto-pin, pageable semantics after it, graph
// ranges). A side is a byte range from its first to its last byte: for a
// pitched (2D/3D) side, from the first row's first byte to the last row's
// last; a pitch of 0 counts as the width (rows packed back to back).
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda.h"

namespace lazypin {

// One side of a copy as the hook sees it. `lo` 0: device memory (or a CUDA
// array): no host memory. `unified`: a unified-addressing pointer, host or
// device (cuMemcpy, cuMemcpyAsync, CU_MEMORYTYPE_UNIFIED): the driver knows which.
struct CopySide {
  uintptr_t lo = 0;
  size_t bytes = 0;
  bool unified = false;
};

inline CopySide HostSide(const void* p, size_t bytes) {
  return CopySide{reinterpret_cast<uintptr_t>(p), bytes, false};
}
inline CopySide UnifiedSide(CUdeviceptr p, size_t bytes) {
  return CopySide{uintptr_t{p}, bytes, true};
}

// The bytes `rows` rows of `width` bytes span, `pitch` apart (0: width).
inline size_t PitchedSpan(size_t pitch, size_t width, size_t rows) {
  if (rows == 0 || width == 0) return 0;
  return (rows - 1) * (pitch != 0 ? pitch : width) + width;
}

// A pitched side starting `offset` bytes past its base.
inline CopySide PitchedSide(CUmemorytype type, const void* host, CUdeviceptr unified,
                            size_t offset, size_t pitch, size_t width, size_t rows) {
  const size_t span = PitchedSpan(pitch, width, rows);
  if (span == 0) return CopySide{};
  if (type == CU_MEMORYTYPE_HOST && host != nullptr) {
    return HostSide(static_cast<const char*>(host) + offset, span);
  }
  if (type == CU_MEMORYTYPE_UNIFIED && unified != 0) return UnifiedSide(unified + offset, span);
  return CopySide{};
}

// The two sides of a 2D copy; false when it copies nothing.
inline bool Sides2D(const CUDA_MEMCPY2D* c, CopySide* dst, CopySide* src) {
  if (c == nullptr || c->WidthInBytes == 0 || c->Height == 0) return false;
  auto side = [&](CUmemorytype type, const void* host, CUdeviceptr unified, size_t x, size_t y,
                  size_t pitch) {
    const size_t step = pitch != 0 ? pitch : c->WidthInBytes;
    return PitchedSide(type, host, unified, y * step + x, pitch, c->WidthInBytes, c->Height);
  };
  *dst = side(c->dstMemoryType, c->dstHost, c->dstDevice, c->dstXInBytes, c->dstY, c->dstPitch);
  *src = side(c->srcMemoryType, c->srcHost, c->srcDevice, c->srcXInBytes, c->srcY, c->srcPitch);
  return true;
}

// The two sides of a 3D copy (CUDA_MEMCPY3D, or CUDA_MEMCPY3D_PEER: the same
// fields); false when it copies nothing. A layer is `height` rows (0: Height).
template <typename Copy3D>
bool Sides3D(const Copy3D* c, CopySide* dst, CopySide* src) {
  if (c == nullptr || c->WidthInBytes == 0 || c->Height == 0 || c->Depth == 0) return false;
  auto side = [&](CUmemorytype type, const void* host, CUdeviceptr unified, size_t x, size_t y,
                  size_t z, size_t pitch, size_t height) {
    const size_t step = pitch != 0 ? pitch : c->WidthInBytes;
    const size_t h = height != 0 ? height : c->Height;
    return PitchedSide(type, host, unified, (z * h + y) * step + x, pitch, c->WidthInBytes,
                       (c->Depth - 1) * h + c->Height);
  };
  *dst = side(c->dstMemoryType, c->dstHost, c->dstDevice, c->dstXInBytes, c->dstY, c->dstZ,
              c->dstPitch, c->dstHeight);
  *src = side(c->srcMemoryType, c->srcHost, c->srcDevice, c->srcXInBytes, c->srcY, c->srcZ,
              c->srcPitch, c->srcHeight);
  return true;
}

// A pointer operand of cuMemcpy3DBatchAsync: `depth` layers of `layerHeight`
// rows of `rowLength` bytes (0: the extent's).
inline CopySide OperandSide(const CUmemcpy3DOperand& o, const CUextent3D& e) {
  if (o.type != CU_MEMCPY_OPERAND_TYPE_POINTER || o.op.ptr.ptr == 0 || e.width == 0 ||
      e.height == 0 || e.depth == 0) {
    return CopySide{};
  }
  const size_t row = o.op.ptr.rowLength != 0 ? o.op.ptr.rowLength : e.width;
  const size_t layer = o.op.ptr.layerHeight != 0 ? o.op.ptr.layerHeight : e.height;
  return UnifiedSide(o.op.ptr.ptr, PitchedSpan(row, e.width, (e.depth - 1) * layer + e.height));
}

}  // namespace lazypin
