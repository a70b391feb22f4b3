// cudal2 reference kernel family "ptx": the mma family's pipeline with the whole per-k16 inner
// step (4 ldmatrix.x4 for A, 4 ldmatrix.x4 for B, the chain of 32 mma.sync.m16n8k16) written as
// one hand-scheduled inline-PTX block. The PTX fixes the warp tile at 64 x 64 (4 m16 x 8 n8
// fragments): WM and WN must be 64 (the defaults here). Every other macro (BM, BN, BK, STAGES,
// SWIZZLE, SPLITK, ACC_F16, LAYOUT_RC) means what it means in mma_hgemm.cuh, which this file
// includes for the loads, pipeline, epilogue and launcher (instantiate() inlines it).
//
// Operand numbering of the asm block (fixed by the 64 x 64 warp tile):
//   f32 accumulate: %0..%127  = acc[mi][ni][r] at (mi*8 + ni)*4 + r,  %128..%131 A addresses (mi),
//                   %132..%135 B addresses (n16 pair p)
//   f16 accumulate: %0..%63   = acc[mi][ni][h] at (mi*8 + ni)*2 + h,  %64..%67 A, %68..%71 B
// Fragment mapping (same as the mma family): A pair registers ra[4mi..4mi+3] = {a0,a1,a2,a3} of
// m16 fragment mi; B pair p gives rb[4p..4p+1] = {b0,b1} of n8 fragment 2p and rb[4p+2..4p+3] of
// fragment 2p+1.

#ifndef WM
#define WM 64
#endif
#ifndef WN
#define WN 64
#endif
#if WM != 64 || WN != 64
#error "the ptx family's inner-loop PTX is written for a 64 x 64 warp tile (WM = WN = 64)"
#endif
#ifndef ACC_F16
#define ACC_F16 0
#endif
#ifndef LAYOUT_RC
#define LAYOUT_RC 0
#endif
#define CUDAL2_STYLE "ptx"
#define CUDAL2_FAMILY "ptx"
#define CUDAL2_PTX_KSTEP 1

#include <stdint.h>

#if LAYOUT_RC
// B stored N x K (k contiguous): plain ldmatrix yields the "col" B fragment directly.
#define CUDAL2_LDM_B "ldmatrix.sync.aligned.m8n8.x4.shared.b16"
#else
// B stored K x N (n contiguous): .trans turns k-rows into the "col" B fragment.
#define CUDAL2_LDM_B "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16"
#endif

#if !ACC_F16
#define CUDAL2_ACC4(mi, ni) \
  "+f"(acc[mi][ni][0]), "+f"(acc[mi][ni][1]), "+f"(acc[mi][ni][2]), "+f"(acc[mi][ni][3])
#define CUDAL2_ACC_ROW(mi)                                                          \
  CUDAL2_ACC4(mi, 0), CUDAL2_ACC4(mi, 1), CUDAL2_ACC4(mi, 2), CUDAL2_ACC4(mi, 3), \
      CUDAL2_ACC4(mi, 4), CUDAL2_ACC4(mi, 5), CUDAL2_ACC4(mi, 6), CUDAL2_ACC4(mi, 7)

__device__ __forceinline__ void cudal2_ptx_kstep(float (&acc)[4][8][4], const uint32_t (&a)[4],
                                                 const uint32_t (&b)[4]) {
  asm volatile(
      "{\n"
      ".reg .b32 ra<16>;\n"
      ".reg .b32 rb<16>;\n"
      "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {ra0,ra1,ra2,ra3}, [%128];\n"
      "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {ra4,ra5,ra6,ra7}, [%129];\n"
      "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {ra8,ra9,ra10,ra11}, [%130];\n"
      "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {ra12,ra13,ra14,ra15}, [%131];\n"
      CUDAL2_LDM_B " {rb0,rb1,rb2,rb3}, [%132];\n"
      CUDAL2_LDM_B " {rb4,rb5,rb6,rb7}, [%133];\n"
      CUDAL2_LDM_B " {rb8,rb9,rb10,rb11}, [%134];\n"
      CUDAL2_LDM_B " {rb12,rb13,rb14,rb15}, [%135];\n"
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {ra0,ra1,ra2,ra3}, {rb0,rb1}, {%0,%1,%2,%3};\n"
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%4,%5,%6,%7}, {ra0,ra1,ra2,ra3}, {rb2,rb3}, {%4,%5,%6,%7};\n"
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%8,%9,%10,%11}, {ra0,ra1,ra2,ra3}, {rb4,rb5}, {%8,%9,%10,%11};\n"
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%12,%13,%14,%15}, {ra0,ra1,ra2,ra3}, {rb6,rb7}, {%12,%13,%14,%15};\n"
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%16,%17,%18,%19}, {ra0,ra1,ra2,ra3}, {rb8,rb9}, {%16,%17,%18,%19};\n"
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%20,%21,%22,%23}, {ra0,ra1,ra2,ra3}, {rb10,rb11}, {%20,%21,%22,%23};\n"
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%24,%25,%26,%27}, {ra0,ra1,ra2,ra3}, {rb12,rb13}, {%24,%25,%26,%27};\n"
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%28,%29,%30,%31}, {ra0,ra1,ra2,ra3}, {rb14,rb15}, {%28,%29,%30,%31};\n"
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%32,%33,%34,%35}, {ra4,ra5,ra6,ra7}, {rb0,rb1}, {%32,%33,%34,%35};\n"
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%36,%37,%38,%39}, {ra4,ra5,ra6,ra7}, {rb2,rb3}, {%36,%37,%38,%39};\n"
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%40,%41,%42,%43}, {ra4,ra5,ra6,ra7}, {rb4,rb5}, {%40,%41,%42,%43};\n"
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%44,%45,%46,%47}, {ra4,ra5,ra6,ra7}, {rb6,rb7}, {%44,%45,%46,%47};\n"
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%48,%49,%50,%51}, {ra4,ra5,ra6,ra7}, {rb8,rb9}, {%48,%49,%50,%51};\n"
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%52,%53,%54,%55}, {ra4,ra5,ra6,ra7}, {rb10,rb11}, {%52,%53,%54,%55};\n"
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%56,%57,%58,%59}, {ra4,ra5,ra6,ra7}, {rb12,rb13}, {%56,%57,%58,%59};\n"
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%60,%61,%62,%63}, {ra4,ra5,ra6,ra7}, {rb14,rb15}, {%60,%61,%62,%63};\n"
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%64,%65,%66,%67}, {ra8,ra9,ra10,ra11}, {rb0,rb1}, {%64,%65,%66,%67};\n"
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%68,%69,%70,%71}, {ra8,ra9,ra10,ra11}, {rb2,rb3}, {%68,%69,%70,%71};\n"
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%72,%73,%74,%75}, {ra8,ra9,ra10,ra11}, {rb4,rb5}, {%72,%73,%74,%75};\n"
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%76,%77,%78,%79}, {ra8,ra9,ra10,ra11}, {rb6,rb7}, {%76,%77,%78,%79};\n"
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%80,%81,%82,%83}, {ra8,ra9,ra10,ra11}, {rb8,rb9}, {%80,%81,%82,%83};\n"
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%84,%85,%86,%87}, {ra8,ra9,ra10,ra11}, {rb10,rb11}, {%84,%85,%86,%87};\n"
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%88,%89,%90,%91}, {ra8,ra9,ra10,ra11}, {rb12,rb13}, {%88,%89,%90,%91};\n"
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%92,%93,%94,%95}, {ra8,ra9,ra10,ra11}, {rb14,rb15}, {%92,%93,%94,%95};\n"
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%96,%97,%98,%99}, {ra12,ra13,ra14,ra15}, {rb0,rb1}, {%96,%97,%98,%99};\n"
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%100,%101,%102,%103}, {ra12,ra13,ra14,ra15}, {rb2,rb3}, {%100,%101,%102,%103};\n"
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%104,%105,%106,%107}, {ra12,ra13,ra14,ra15}, {rb4,rb5}, {%104,%105,%106,%107};\n"
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%108,%109,%110,%111}, {ra12,ra13,ra14,ra15}, {rb6,rb7}, {%108,%109,%110,%111};\n"
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%112,%113,%114,%115}, {ra12,ra13,ra14,ra15}, {rb8,rb9}, {%112,%113,%114,%115};\n"
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%116,%117,%118,%119}, {ra12,ra13,ra14,ra15}, {rb10,rb11}, {%116,%117,%118,%119};\n"
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%120,%121,%122,%123}, {ra12,ra13,ra14,ra15}, {rb12,rb13}, {%120,%121,%122,%123};\n"
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%124,%125,%126,%127}, {ra12,ra13,ra14,ra15}, {rb14,rb15}, {%124,%125,%126,%127};\n"
      "}\n"
      : CUDAL2_ACC_ROW(0), CUDAL2_ACC_ROW(1), CUDAL2_ACC_ROW(2), CUDAL2_ACC_ROW(3)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(b[2]), "r"(b[3])
      : "memory");
}
#else
#define CUDAL2_ACC2(mi, ni) "+r"(acc[mi][ni][0]), "+r"(acc[mi][ni][1])
#define CUDAL2_ACC_ROW(mi)                                                          \
  CUDAL2_ACC2(mi, 0), CUDAL2_ACC2(mi, 1), CUDAL2_ACC2(mi, 2), CUDAL2_ACC2(mi, 3), \
      CUDAL2_ACC2(mi, 4), CUDAL2_ACC2(mi, 5), CUDAL2_ACC2(mi, 6), CUDAL2_ACC2(mi, 7)

__device__ __forceinline__ void cudal2_ptx_kstep(uint32_t (&acc)[4][8][2], const uint32_t (&a)[4],
                                                 const uint32_t (&b)[4]) {
  asm volatile(
      "{\n"
      ".reg .b32 ra<16>;\n"
      ".reg .b32 rb<16>;\n"
      "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {ra0,ra1,ra2,ra3}, [%64];\n"
      "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {ra4,ra5,ra6,ra7}, [%65];\n"
      "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {ra8,ra9,ra10,ra11}, [%66];\n"
      "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {ra12,ra13,ra14,ra15}, [%67];\n"
      CUDAL2_LDM_B " {rb0,rb1,rb2,rb3}, [%68];\n"
      CUDAL2_LDM_B " {rb4,rb5,rb6,rb7}, [%69];\n"
      CUDAL2_LDM_B " {rb8,rb9,rb10,rb11}, [%70];\n"
      CUDAL2_LDM_B " {rb12,rb13,rb14,rb15}, [%71];\n"
      "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%0,%1}, {ra0,ra1,ra2,ra3}, {rb0,rb1}, {%0,%1};\n"
      "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%2,%3}, {ra0,ra1,ra2,ra3}, {rb2,rb3}, {%2,%3};\n"
      "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%4,%5}, {ra0,ra1,ra2,ra3}, {rb4,rb5}, {%4,%5};\n"
      "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%6,%7}, {ra0,ra1,ra2,ra3}, {rb6,rb7}, {%6,%7};\n"
      "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%8,%9}, {ra0,ra1,ra2,ra3}, {rb8,rb9}, {%8,%9};\n"
      "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%10,%11}, {ra0,ra1,ra2,ra3}, {rb10,rb11}, {%10,%11};\n"
      "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%12,%13}, {ra0,ra1,ra2,ra3}, {rb12,rb13}, {%12,%13};\n"
      "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%14,%15}, {ra0,ra1,ra2,ra3}, {rb14,rb15}, {%14,%15};\n"
      "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%16,%17}, {ra4,ra5,ra6,ra7}, {rb0,rb1}, {%16,%17};\n"
      "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%18,%19}, {ra4,ra5,ra6,ra7}, {rb2,rb3}, {%18,%19};\n"
      "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%20,%21}, {ra4,ra5,ra6,ra7}, {rb4,rb5}, {%20,%21};\n"
      "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%22,%23}, {ra4,ra5,ra6,ra7}, {rb6,rb7}, {%22,%23};\n"
      "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%24,%25}, {ra4,ra5,ra6,ra7}, {rb8,rb9}, {%24,%25};\n"
      "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%26,%27}, {ra4,ra5,ra6,ra7}, {rb10,rb11}, {%26,%27};\n"
      "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%28,%29}, {ra4,ra5,ra6,ra7}, {rb12,rb13}, {%28,%29};\n"
      "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%30,%31}, {ra4,ra5,ra6,ra7}, {rb14,rb15}, {%30,%31};\n"
      "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%32,%33}, {ra8,ra9,ra10,ra11}, {rb0,rb1}, {%32,%33};\n"
      "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%34,%35}, {ra8,ra9,ra10,ra11}, {rb2,rb3}, {%34,%35};\n"
      "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%36,%37}, {ra8,ra9,ra10,ra11}, {rb4,rb5}, {%36,%37};\n"
      "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%38,%39}, {ra8,ra9,ra10,ra11}, {rb6,rb7}, {%38,%39};\n"
      "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%40,%41}, {ra8,ra9,ra10,ra11}, {rb8,rb9}, {%40,%41};\n"
      "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%42,%43}, {ra8,ra9,ra10,ra11}, {rb10,rb11}, {%42,%43};\n"
      "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%44,%45}, {ra8,ra9,ra10,ra11}, {rb12,rb13}, {%44,%45};\n"
      "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%46,%47}, {ra8,ra9,ra10,ra11}, {rb14,rb15}, {%46,%47};\n"
      "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%48,%49}, {ra12,ra13,ra14,ra15}, {rb0,rb1}, {%48,%49};\n"
      "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%50,%51}, {ra12,ra13,ra14,ra15}, {rb2,rb3}, {%50,%51};\n"
      "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%52,%53}, {ra12,ra13,ra14,ra15}, {rb4,rb5}, {%52,%53};\n"
      "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%54,%55}, {ra12,ra13,ra14,ra15}, {rb6,rb7}, {%54,%55};\n"
      "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%56,%57}, {ra12,ra13,ra14,ra15}, {rb8,rb9}, {%56,%57};\n"
      "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%58,%59}, {ra12,ra13,ra14,ra15}, {rb10,rb11}, {%58,%59};\n"
      "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%60,%61}, {ra12,ra13,ra14,ra15}, {rb12,rb13}, {%60,%61};\n"
      "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%62,%63}, {ra12,ra13,ra14,ra15}, {rb14,rb15}, {%62,%63};\n"
      "}\n"
      : CUDAL2_ACC_ROW(0), CUDAL2_ACC_ROW(1), CUDAL2_ACC_ROW(2), CUDAL2_ACC_ROW(3)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(b[2]), "r"(b[3])
      : "memory");
}
#endif

#include "mma_hgemm.cuh"
