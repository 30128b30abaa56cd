// The end-of-call check (ringreduce/safety/signature.py says what is compared and why).
//
// rr_put_signature writes [s, ~s] before the call's last operation, an all-reduce (MAX)
// of those two words over every rank; rr_check_signature then compares the result with
// this rank's own s. Ranks that agree get [s, ~s] back; otherwise the first mismatch is
// written into host memory the watchdog reads (report: [state, largest, smallest, own],
// state 1 once the other three are written), and the call is failed there, not
// reported finished. One thread each: two words, once per call.
//
// Compiled at run time by NVRTC through cupy.RawModule (ringreduce/execution/kernels.py).

__global__ void rr_put_signature(long long* words, long long signature) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    words[0] = signature;
    words[1] = ~signature;
}

__global__ void rr_check_signature(const long long* got, long long signature,
                                   volatile long long* report) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    const long long largest = got[0], smallest = ~got[1];
    if (largest == signature && smallest == signature) return;
    if (report[0] != 0) return;  // the first mismatch is the one reported (one stream)
    report[1] = largest;
    report[2] = smallest;
    report[3] = signature;
    __threadfence_system();  // the words before the state, as the host reads them
    report[0] = 1;
}
