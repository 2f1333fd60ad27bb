// copy_sides (shim/cuda/copy_sides.h): the host bytes each side of a 2D, 3D
// and batched copy can touch, the one definition every copy hook uses.
#include "copy_sides.h"

#include <gtest/gtest.h>

#include <cstring>

namespace lazypin {
namespace {

constexpr uintptr_t kHost = 0x7f0000000000;
const void* Host() { return reinterpret_cast<const void*>(kHost); }

TEST(CopySidesTest, PitchedSpanCoversFirstToLastRow) {
  EXPECT_EQ(PitchedSpan(256, 100, 4), 3 * 256 + 100u);
  EXPECT_EQ(PitchedSpan(0, 100, 4), 400u) << "pitch 0: rows back to back";
  EXPECT_EQ(PitchedSpan(256, 100, 0), 0u);
  EXPECT_EQ(PitchedSpan(256, 0, 4), 0u);
}

TEST(CopySidesTest, TwoDimensionalHostToDevice) {
  CUDA_MEMCPY2D c;
  memset(&c, 0, sizeof c);
  c.srcMemoryType = CU_MEMORYTYPE_HOST;
  c.srcHost = Host();
  c.srcXInBytes = 8;
  c.srcY = 2;
  c.srcPitch = 1024;
  c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  c.dstDevice = 0x1000;
  c.WidthInBytes = 512;
  c.Height = 10;
  CopySide dst, src;
  ASSERT_TRUE(Sides2D(&c, &dst, &src));
  EXPECT_EQ(dst.lo, 0u) << "device memory: no host side";
  EXPECT_EQ(src.lo, kHost + 2 * 1024 + 8);
  EXPECT_EQ(src.bytes, 9 * 1024 + 512u);
  EXPECT_FALSE(src.unified);
  c.srcPitch = 0;  // packed rows: the offset and the span both step by the width
  ASSERT_TRUE(Sides2D(&c, &dst, &src));
  EXPECT_EQ(src.lo, kHost + 2 * 512 + 8);
  EXPECT_EQ(src.bytes, 10 * 512u);
  c.Height = 0;
  EXPECT_FALSE(Sides2D(&c, &dst, &src));
}

TEST(CopySidesTest, ThreeDimensionalLayersOfTheirOwnHeight) {
  CUDA_MEMCPY3D c;
  memset(&c, 0, sizeof c);
  c.dstMemoryType = CU_MEMORYTYPE_UNIFIED;
  c.dstDevice = kHost;
  c.dstPitch = 256;
  c.dstHeight = 8;  // rows per layer
  c.dstZ = 1;
  c.srcMemoryType = CU_MEMORYTYPE_ARRAY;
  c.WidthInBytes = 100;
  c.Height = 4;
  c.Depth = 3;
  CopySide dst, src;
  ASSERT_TRUE(Sides3D(&c, &dst, &src));
  EXPECT_EQ(src.lo, 0u) << "an array: no host side";
  EXPECT_TRUE(dst.unified);
  EXPECT_EQ(dst.lo, kHost + 1 * 8 * 256);
  // Layers 1..3 of 8 rows; the last layer's last copied row is row 3.
  EXPECT_EQ(dst.bytes, ((3 - 1) * 8 + 4 - 1) * 256 + 100u);
  c.dstHeight = 0;  // a layer is Height rows
  ASSERT_TRUE(Sides3D(&c, &dst, &src));
  EXPECT_EQ(dst.lo, kHost + 1 * 4 * 256);
  EXPECT_EQ(dst.bytes, ((3 - 1) * 4 + 4 - 1) * 256 + 100u);
}

TEST(CopySidesTest, BatchOperandWithRowLengthAndLayerHeight) {
  CUmemcpy3DOperand o;
  memset(&o, 0, sizeof o);
  o.type = CU_MEMCPY_OPERAND_TYPE_POINTER;
  o.op.ptr.ptr = kHost;
  o.op.ptr.rowLength = 128;
  o.op.ptr.layerHeight = 16;
  CUextent3D e{64, 4, 2};
  const CopySide side = OperandSide(o, e);
  EXPECT_EQ(side.lo, kHost);
  EXPECT_EQ(side.bytes, ((2 - 1) * 16 + 4 - 1) * 128 + 64u);
  o.type = CU_MEMCPY_OPERAND_TYPE_ARRAY;
  EXPECT_EQ(OperandSide(o, e).lo, 0u);
}

}  // namespace
}  // namespace lazypin
