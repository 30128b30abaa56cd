// The Program type (program_type.h): Program(code, args, extent) decodes and validates
// (program.h's decode) once; len() and counts() read the validated instructions.
#include "program_type.h"

#include <memory>
#include <string>
#include <vector>

namespace ringreduce {
namespace {

// d[name] = value, for a dict of small ints.
void set_long(PyObject* d, const char* name, long value) {
    PyObject* v = PyLong_FromLong(value);
    PyDict_SetItemString(d, name, v);
    Py_DECREF(v);
}

PyObject* program_counts(PyProgram* self, PyObject*) {
    PyObject* d = PyDict_New();
    std::vector<long> n(OP_COUNT, 0);
    for (const Instr& in : self->program->code) ++n[in.op];
    for (int i = 0; i < OP_COUNT; ++i)
        if (n[i]) set_long(d, kOpNames[i], n[i]);
    return d;
}

Py_ssize_t program_len(PyProgram* self) {
    return static_cast<Py_ssize_t>(self->program->code.size());
}

}  // namespace

void program_dealloc(PyProgram* self) {
    delete self->program;
    Py_TYPE(self)->tp_free(reinterpret_cast<PyObject*>(self));
}

int program_init(PyProgram* self, PyObject* a, PyObject* kw) {
    static const char* names[] = {"code", "args", "extent", nullptr};
    Py_buffer code, args;
    long long extent;
    if (!PyArg_ParseTupleAndKeywords(a, kw, "y*y*L", const_cast<char**>(names), &code, &args,
                                     &extent))
        return -1;
    auto program = std::make_unique<Program>();
    std::string problem = decode(code.buf, static_cast<size_t>(code.len), args.buf,
                                 static_cast<size_t>(args.len), extent, *program);
    PyBuffer_Release(&code);
    PyBuffer_Release(&args);
    if (!problem.empty()) {
        PyErr_SetString(PyExc_ValueError, ("invalid ringreduce program: " + problem).c_str());
        return -1;
    }
    delete self->program;
    self->program = program.release();
    return 0;
}

PyMethodDef program_methods[] = {
    {"counts", reinterpret_cast<PyCFunction>(program_counts), METH_NOARGS,
     "Instructions by op name."},
    {nullptr, nullptr, 0, nullptr}};

PySequenceMethods program_seq = {reinterpret_cast<lenfunc>(program_len)};

PyTypeObject ProgramType = {PyVarObject_HEAD_INIT(nullptr, 0)};

PyObject* op_numbers() {
    PyObject* ops = PyDict_New();
    for (int i = 0; i < OP_COUNT; ++i) set_long(ops, kOpNames[i], i);
    return ops;
}

}  // namespace ringreduce
