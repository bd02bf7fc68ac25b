// A probe of TMA tensor copies (cuTensorMapEncodeTiled maps, 128-byte swizzle) feeding Hopper's
// wgmma B operand from the swizzled tiles, for the chain kernel of lab/wgmma_chain.cu: which
// descriptor offsets make wgmma read a TMA-written tile as the products need it.
//
// B global: [64 rows][128] bf16 row-major (a chunk's k rows: row = token).  Two TMA boxes of
// [64 rows][64 columns] (128 bytes a row, 128-byte swizzle) land at sb and sb + 8 KB; the raw
// shared bytes are copied out (``Braw``) so the host checks the placement on its own.
// GDN_MODE 0 (K-major, X = S0 k^T's form): D [64, 64] = A [64, 16] B[:, 16 s .. 16 s + 16]^T,
//   the descriptor starting at box (s / 4) + 32 (s % 4) bytes.
// GDN_MODE 1 (MN-major, the update's form, imm-trans-b 1): D [64, 128] = A [64, 16]
//   B[16 s .. 16 s + 16, :], the descriptor starting at box 0 + 2048 s bytes.
// A: no swizzle core matrices (lab/wgmma_probe.cu: LBO 128 along K, SBO 256 along M).
typedef unsigned short bf16_t;
struct alignas(64) TMap { unsigned long long v[16]; };
struct ProbeParams {
    TMap tmap;
    const bf16_t* A; bf16_t* Braw; float* D;
    long long lbo, sbo, s;
};
__device__ __forceinline__ unsigned smem_u32(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ unsigned long long desc(unsigned addr, long long lbo, long long sbo,
                                                   int sw) {
    return (unsigned long long)((addr & 0x3FFFF) >> 4)
         | ((unsigned long long)((lbo >> 4) & 0x3FFF) << 16)
         | ((unsigned long long)((sbo >> 4) & 0x3FFF) << 32)
         | ((unsigned long long)sw << 62);
}
extern "C" __global__ void __launch_bounds__(128) tma_probe(const __grid_constant__ ProbeParams p) {
    // the boxes at the start of 100 KB of dynamic shared memory: a wrong (LBO, SBO) reads
    // garbage inside the CTA's shared memory, not past it
    extern __shared__ __align__(1024) bf16_t sb[];
    __shared__ __align__(1024) bf16_t sa[64 * 16];
    __shared__ __align__(8) unsigned long long bar;
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    for (int i = tid; i < 64 * 16; i += 128) {
        const int m = i / 16, k = i % 16;
        sa[((m / 8) * 256 + (k / 8) * 128 + (m % 8) * 16 + (k % 8) * 2) / 2] = p.A[i];
    }
    const unsigned b = smem_u32(&bar);
    if (tid == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(b) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (tid == 0) {
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                     :: "r"(b), "r"(2 * 64 * 64 * 2) : "memory");
        const unsigned long long tm = reinterpret_cast<unsigned long long>(&p.tmap);
#pragma unroll
        for (int box = 0; box < 2; ++box)
            asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                         " [%0], [%1, {%2, %3}], [%4];"
                         :: "r"(smem_u32(sb + box * 64 * 64)), "l"(tm), "r"(64 * box), "r"(0),
                            "r"(b) : "memory");
    }
    asm volatile("{\n\t.reg .pred P1;\n\tWAIT:\n\t"
                 "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], 0;\n\t"
                 "@!P1 bra WAIT;\n}" :: "r"(b) : "memory");
    for (int i = tid; i < 2 * 64 * 64; i += 128) p.Braw[i] = sb[i];
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    const unsigned long long da = desc(smem_u32(sa), 128, 256, 0);
    const int s = (int)p.s, g = lane >> 2, t4 = lane & 3;
#if GDN_MODE == 0
    float d[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) d[i] = 0.f;
    const unsigned long long db = desc(smem_u32(sb + (s / 4) * 64 * 64) + 32 * (s % 4), p.lbo,
                                       p.sbo, 1);
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
    asm volatile("{\n\t.reg .pred q;\n\tsetp.ne.b32 q, 0, 0;\n\t"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, "
                 "%17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
                 "%32, %33, q, 1, 1, 0, 0;\n}"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
                   "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
                   "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
                   "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
                   "+f"(d[30]), "+f"(d[31])
                 : "l"(da), "l"(db));
    constexpr int NN = 64;
#else
    float d[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) d[i] = 0.f;
    const unsigned long long db = desc(smem_u32(sb) + 2048 * s, p.lbo, p.sbo, 1);
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
    asm volatile("{\n\t.reg .pred q;\n\tsetp.ne.b32 q, 0, 0;\n\t"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, "
                 "%17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, "
                 "%47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, "
                 "%62, %63}, %64, %65, q, 1, 1, 0, 1;\n}"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
                   "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
                   "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
                   "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
                   "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
                   "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
                   "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]),
                   "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),
                   "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(da), "l"(db));
    constexpr int NN = 128;
#endif
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
#pragma unroll
    for (int j = 0; j < NN / 8; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = 16 * w + g + 8 * h, col = 8 * j + 2 * t4;
            p.D[row * NN + col] = d[4 * j + 2 * h];
            p.D[row * NN + col + 1] = d[4 * j + 2 * h + 1];
        }
}
