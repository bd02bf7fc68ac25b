// The switch defaults of cuda-v4's kernels (cuda_v4.cu, cuda_v4_kfirst.cu): the speculative
// verify's GDN_INTER and GDN_UPDATE come both (a verify variant) or neither (a plain decode: 0,
// no intermediate states, and 1, the final state stored); GDN_PDL is 0 unless given.
#pragma once

#if defined(GDN_INTER) != defined(GDN_UPDATE)
#error "GDN_INTER and GDN_UPDATE: both (a verify variant) or neither (a plain decode)"
#endif
#ifndef GDN_INTER
#define GDN_INTER 0
#define GDN_UPDATE 1
#endif
#ifndef GDN_PDL
#define GDN_PDL 0
#endif
