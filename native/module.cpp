// ringreduce._native: replays a recorded call program on the caller's thread, without
// the GIL, before the call returns (Issuer.run, the "native" issuer).
//
// The Python issuer (ringreduce/execution/pipeline.py) walks a call's plan and makes
// ~100 CUDA and NCCL calls from Python: about 2 ms of the caller's host time per 25 MiB
// call. Here the same sequence, recorded once per plan key
// (ringreduce/execution/recording.py), is a flat array of instructions.
//
// The files: driver.h/.cpp (CUDA driver and NCCL, loaded with dlopen; holders of what
// the issuer creates), program.h/.cpp (the instruction format and its validator),
// issuer.h/.cpp (jobs issued, failures kept), program_type.h/.cpp (the Program type),
// and this one, the Issuer type and the module.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <memory>
#include <string>

#include "issuer.h"
#include "program.h"
#include "program_type.h"

namespace ringreduce {
namespace {

// ---- Issuer: the issuer's State as a Python object ----------------------------------
struct Issuer {
    PyObject_HEAD
    State* s;
};

void issuer_dealloc(Issuer* self) {
    delete self->s;  // its events, then its flag's memory (State's holders)
    Py_TYPE(self)->tp_free(reinterpret_cast<PyObject*>(self));
}

int issuer_init(Issuer* self, PyObject* a, PyObject* kw) {
    static const char* names[] = {"libcuda", "libnccl", "flag_stream", nullptr};
    const char* libcuda = nullptr;
    const char* libnccl = nullptr;
    unsigned long long flag_stream = 0;
    if (!PyArg_ParseTupleAndKeywords(a, kw, "|zzK", const_cast<char**>(names), &libcuda,
                                     &libnccl, &flag_stream))
        return -1;
    if (self->s) {
        PyErr_SetString(PyExc_RuntimeError, "Issuer is already initialised");
        return -1;
    }
    if ((libcuda == nullptr) != (libnccl == nullptr)) {
        PyErr_SetString(PyExc_ValueError, "give both libcuda and libnccl, or neither (tests)");
        return -1;
    }
    auto s = std::make_unique<State>();
    if (libcuda) {
        std::string err =
            start_cuda(*s, libcuda, libnccl, reinterpret_cast<CUstream>(flag_stream));
        if (!err.empty()) {
            s.reset();  // destroys the events and the flag's memory made so far
            PyErr_SetString(PyExc_RuntimeError, ("ringreduce native issuer: " + err).c_str());
            return -1;
        }
    }
    self->s = s.release();
    return 0;
}

// The arguments of run: (program, base, entry_stream, after=0); the Program,
// or nullptr with the Python error set. `after`: an earlier job on the same memory that
// this one must follow on the device; its done event joins the entry wait, so the caller
// need not wait on the host for that job to be issued (issue.py after_pending).
const Program* job_args(const State& s, PyObject* args, PyObject** program,
                        unsigned long long* base, unsigned long long* entry_stream,
                        uint32_t* after) {
    unsigned long after_arg = 0;
    if (!PyArg_ParseTuple(args, "O!KK|k", &ProgramType, program, base, entry_stream,
                          &after_arg))
        return nullptr;
    const Program* p = reinterpret_cast<PyProgram*>(*program)->program;
    if (p->needs_cuda && !s.has_cuda) {
        PyErr_SetString(PyExc_ValueError, "this program issues CUDA work; the Issuer was "
                                          "made without libcuda/libnccl");
        return nullptr;
    }
    *after = static_cast<uint32_t>(after_arg);
    uint32_t last = s.submitted.load();
    if (*after && (after_arg > UINT32_MAX || seq_before(last, *after))) {
        PyErr_Format(PyExc_ValueError, "after=%lu is not a submitted job (the last is %lu); "
                     "pass a number run() returned, or 0",
                     after_arg, static_cast<unsigned long>(last));
        return nullptr;
    }
    return p;
}

// run(program, base, entry_stream, after=0) -> seq: the job issued here, on the calling
// thread, without the GIL, before returning. The same program and the same order as the
// Python issuer, only without ~100 Python calls. One job at a time per process
// (issue_mutex); the job's number is taken under it, so jobs are issued in their order.
PyObject* issuer_run(Issuer* self, PyObject* args) {
    PyObject* program;
    unsigned long long base, entry_stream;
    uint32_t after;
    const Program* p = job_args(*self->s, args, &program, &base, &entry_stream, &after);
    if (!p) return nullptr;
    State& s = *self->s;
    if (s.closing.load()) {
        PyErr_SetString(PyExc_RuntimeError, "the native issuer is closed");
        return nullptr;
    }
    uint32_t seq;
    Py_BEGIN_ALLOW_THREADS
    seq = submit(s, *p, base, reinterpret_cast<CUstream>(entry_stream), after);
    Py_END_ALLOW_THREADS  // every lock is released before the GIL is taken back
    return PyLong_FromUnsignedLong(seq);
}

// stream_wait(stream, seq): stream waits (on the device) until job seq has finished: an
// event wait on its done event, recorded on the flag stream after the job's last work.
// Only for issued jobs (the event is recorded then): a stream never waits on work that
// is not enqueued yet, because a context-wide synchronisation (CUDA loading a kernel
// lazily, a free), in any thread, would then wait for that stream, and so for the
// issuing thread, which may itself be the one synchronising (a deadlock, seen on H200
// before this rule). An event, not cuStreamWaitValue32 on the mapped flag: tried twice
// under MPS, the flag wait hung (H200) and let futures complete before their results
// (H100), as CUDA's driver API warns: orderings made through stream memory operations
// are not visible to CUDA and must also be expressed with events. Event waits are what
// the Python issuer's streams have always used. A job more than kEntryRing behind the
// newest issued one has had its event recorded again by a later job on the same
// in-order stream: the wait then lasts until that later job, longer but never too short.
PyObject* issuer_stream_wait(Issuer* self, PyObject* args) {
    unsigned long long stream;
    unsigned long seq_arg;
    if (!PyArg_ParseTuple(args, "Kk", &stream, &seq_arg)) return nullptr;
    State& s = *self->s;
    uint32_t seq = static_cast<uint32_t>(seq_arg);
    if (!s.has_cuda) Py_RETURN_NONE;
    if (seq_before(s.issued.load(), seq)) {
        PyErr_SetString(PyExc_RuntimeError, "stream_wait before the job was issued");
        return nullptr;
    }
    make_current(s);
    CUresult r;
    Py_BEGIN_ALLOW_THREADS  // as in run: a full launch queue may block here
    r = s.cuda.streamWaitEvent(reinterpret_cast<CUstream>(stream), s.done(seq), 0);
    Py_END_ALLOW_THREADS
    if (r) {
        PyErr_SetString(PyExc_RuntimeError,
                        cu_error(s.cuda, r, "cuStreamWaitEvent (done)").c_str());
        return nullptr;
    }
    Py_RETURN_NONE;
}

// state(seq): 1 finished (flag reached it; CPU-only issuers: issued), 0 pending,
// -1 failed (the issuer stored an error).
PyObject* issuer_state(Issuer* self, PyObject* arg) {
    uint32_t seq = static_cast<uint32_t>(PyLong_AsUnsignedLong(arg));
    if (PyErr_Occurred()) return nullptr;
    State& s = *self->s;
    if (s.failed.load()) return PyLong_FromLong(-1);
    uint32_t reached = s.has_cuda ? *s.flag : s.issued.load();
    return PyLong_FromLong(seq_before(reached, seq) ? 0 : 1);
}

PyObject* issuer_error(Issuer* self, PyObject*) {
    State& s = *self->s;
    std::lock_guard<std::mutex> lock(s.mu);
    if (!s.failure.set) Py_RETURN_NONE;
    return Py_BuildValue("(kLLs)", static_cast<unsigned long>(s.failure.seq),
                         static_cast<long long>(s.failure.stage),
                         static_cast<long long>(s.failure.index), s.failure.message.c_str());
}

// stop(timeout_s): issue nothing more (the communicators are about to be aborted) and
// wait until the issuing thread is outside CUDA/NCCL; False if it is still inside then.
PyObject* issuer_stop(Issuer* self, PyObject* args) {
    double timeout_s = 2.0;
    if (!PyArg_ParseTuple(args, "|d", &timeout_s)) return nullptr;
    State& s = *self->s;
    bool out = false;
    Py_BEGIN_ALLOW_THREADS
    out = stop(s, timeout_s);
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(out);
}

// release(): after a failure, the flag (what the host and the watchdog read) jumps to
// the last submitted job (one stuck inside NCCL included): the watchdog stops polling
// jobs that will never finish. Streams only ever wait for issued jobs' done events,
// which the flag stream reaches once the aborted kernels exit. The issuer still writes
// each job's flag in order afterwards, so the flag ends at the last job.
PyObject* issuer_release(Issuer* self, PyObject*) {
    State& s = *self->s;
    if (s.has_cuda) *s.flag = s.submitted.load();
    Py_RETURN_NONE;
}

// close(): run refuses jobs from now on (every job run took was issued before it
// returned: nothing is left to issue).
PyObject* issuer_close(Issuer* self, PyObject*) {
    self->s->closing.store(true);
    Py_RETURN_NONE;
}

PyObject* issuer_counters(Issuer* self, PyObject*) {
    State& s = *self->s;
    uint32_t flag = s.has_cuda ? *s.flag : 0;
    int64_t op = s.at_op.load(std::memory_order_relaxed);
    return Py_BuildValue("{s:k,s:k,s:k,s:k,s:L,s:s}", "submitted",
                         static_cast<unsigned long>(s.submitted.load()), "issued",
                         static_cast<unsigned long>(s.issued.load()), "flag",
                         static_cast<unsigned long>(flag), "at_job",
                         static_cast<unsigned long>(s.at_seq.load(std::memory_order_relaxed)),
                         "at_instruction",
                         static_cast<long long>(s.at_index.load(std::memory_order_relaxed)),
                         "at_op", op >= 0 && op < OP_COUNT ? kOpNames[op] : "-");
}

// events(seq) -> (entry, done) of job seq: 1 reached, 0 not yet (CUDA_ERROR_NOT_READY),
// -1 another error; None without CUDA. For a deadline error: an entry not reached means
// the caller's stream has not got to the call; an entry reached and no done, the job
// itself is stuck. Either may have been recorded again by a job kEntryRing later.
PyObject* issuer_events(Issuer* self, PyObject* arg) {
    uint32_t seq = static_cast<uint32_t>(PyLong_AsUnsignedLong(arg));
    if (PyErr_Occurred()) return nullptr;
    State& s = *self->s;
    if (!s.has_cuda) Py_RETURN_NONE;
    make_current(s);
    auto state = [&](CUevent e) {
        CUresult r = s.cuda.eventQuery(e);
        return r == 0 ? 1 : r == kNotReady ? 0 : -1;
    };
    return Py_BuildValue("(ii)", state(s.entry(seq)), state(s.done(seq)));
}

PyMethodDef issuer_methods[] = {
    {"run", reinterpret_cast<PyCFunction>(issuer_run), METH_VARARGS,
     "run(program, base, entry_stream, after=0) -> seq: issue the job on this thread, now"},
    {"stream_wait", reinterpret_cast<PyCFunction>(issuer_stream_wait), METH_VARARGS,
     "stream_wait(stream, seq): the stream waits for an issued job's done event"},
    {"state", reinterpret_cast<PyCFunction>(issuer_state), METH_O,
     "state(seq): 1 finished, 0 pending, -1 failed"},
    {"error", reinterpret_cast<PyCFunction>(issuer_error), METH_NOARGS,
     "None, or (seq, stage, instruction, message) of the first failure"},
    {"stop", reinterpret_cast<PyCFunction>(issuer_stop), METH_VARARGS,
     "stop(timeout_s=2): issue nothing more; True once no thread is inside its CUDA/NCCL"},
    {"release", reinterpret_cast<PyCFunction>(issuer_release), METH_NOARGS,
     "after a failure: the host-visible flag jumps to the last submitted job"},
    {"close", reinterpret_cast<PyCFunction>(issuer_close), METH_NOARGS,
     "refuse further jobs"},
    {"events", reinterpret_cast<PyCFunction>(issuer_events), METH_O,
     "events(seq) -> (entry, done): 1 reached, 0 not yet, -1 error; None without CUDA"},
    {"counters", reinterpret_cast<PyCFunction>(issuer_counters), METH_NOARGS,
     "submitted, issued, flag; the job, instruction and op being issued ('-': idle)"},
    {nullptr, nullptr, 0, nullptr}};

PyTypeObject IssuerType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// ---- The module -----------------------------------------------------------------------
PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_native",
                          "ringreduce's native issuer (native/module.cpp)", -1, nullptr};

// A type of the module: its fields, then PyType_Ready.
int ready(PyTypeObject& type, const char* name, Py_ssize_t size, initproc init,
          destructor dealloc, PyMethodDef* methods, const char* doc) {
    type.tp_name = name;
    type.tp_basicsize = size;
    type.tp_flags = Py_TPFLAGS_DEFAULT;
    type.tp_new = PyType_GenericNew;
    type.tp_init = init;
    type.tp_dealloc = dealloc;
    type.tp_methods = methods;
    type.tp_doc = doc;
    return PyType_Ready(&type);
}

}  // namespace
}  // namespace ringreduce

PyMODINIT_FUNC PyInit__native() {
    using namespace ringreduce;
    ProgramType.tp_as_sequence = &program_seq;
    if (ready(ProgramType, "ringreduce._native.Program", sizeof(PyProgram),
              reinterpret_cast<initproc>(program_init),
              reinterpret_cast<destructor>(program_dealloc), program_methods,
              "Program(code, args, extent): a validated call program") < 0 ||
        ready(IssuerType, "ringreduce._native.Issuer", sizeof(Issuer),
              reinterpret_cast<initproc>(issuer_init),
              reinterpret_cast<destructor>(issuer_dealloc), issuer_methods,
              "Issuer(libcuda=None, libnccl=None, flag_stream=0): replays programs") < 0)
        return nullptr;
    PyObject* m = PyModule_Create(&module_def);
    if (!m) return nullptr;
    Py_INCREF(&ProgramType);
    Py_INCREF(&IssuerType);
    PyModule_AddObject(m, "Program", reinterpret_cast<PyObject*>(&ProgramType));
    PyModule_AddObject(m, "Issuer", reinterpret_cast<PyObject*>(&IssuerType));
    PyModule_AddIntConstant(m, "ENTRY_RING", kEntryRing);
    PyModule_AddIntConstant(m, "MAX_KERNEL_ARGS", kMaxKernelArgs);
    PyModule_AddObject(m, "OPS", op_numbers());
    return m;
}
