/*
 * planner.ingest._zmqdrain: drain FPM messages from a ZMQ socket in one call.
 *
 * pyzmq's recv_multipart costs ~6 us per 3-frame message on this class of machine, most of it Python-level
 * dispatch: a recv call per frame and a getsockopt(RCVMORE) after each one. This module receives whole messages
 * in C with zmq_msg_recv and reads the more-flag from the message itself (zmq_msg_more, no getsockopt), so a
 * batch of messages costs one Python call.
 *
 * It does not link libzmq at build time: bind() takes the path of the libzmq that pyzmq already loaded and looks
 * the functions up in that very copy (dlopen with RTLD_NOLOAD), so sockets created by pyzmq are used with the
 * library that created them. Only zmq_msg_* functions are used; the socket stays pyzmq's (its handle comes from
 * zmq.Socket.underlying) and must be used by one thread at a time, as every ZMQ socket.
 *
 * drain(handle, max_messages) -> (payloads, bad_frames, errno)
 *   payloads:   list of bytes, the third frame of every well-formed message [topic, seq (8 bytes), payload],
 *               in arrival order
 *   bad_frames: messages with another frame count or a seq frame that is not 8 bytes (read to their last frame,
 *               so the next message starts clean)
 *   errno:      0 when the socket ran dry (EAGAIN) or max_messages were read; otherwise the ZMQ errno that
 *               stopped the drain (e.g. ETERM, ENOTSOCK, EINTR); what was received before it is returned.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dlfcn.h>
#include <errno.h>
#include <stddef.h>
#include <string.h>

/* zmq.h's zmq_msg_t for libzmq 4.x: 64 opaque bytes, pointer-aligned. bind() checks the library is 4.x. */
typedef struct {
    _Alignas(void *) unsigned char _[64];
} zmq_msg_t;

#define ZMQ_DONTWAIT 1

typedef int (*msg_init_fn)(zmq_msg_t *);
typedef int (*msg_recv_fn)(zmq_msg_t *, void *, int);
typedef int (*msg_close_fn)(zmq_msg_t *);
typedef void *(*msg_data_fn)(zmq_msg_t *);
typedef size_t (*msg_size_fn)(const zmq_msg_t *);
typedef int (*msg_more_fn)(const zmq_msg_t *);
typedef int (*errno_fn)(void);
typedef void (*version_fn)(int *, int *, int *);

static struct {
    msg_init_fn init;
    msg_recv_fn recv;
    msg_close_fn close;
    msg_data_fn data;
    msg_size_fn size;
    msg_more_fn more;
    errno_fn err;
} z;

static int bound = 0;

static PyObject *bind(PyObject *self, PyObject *arg) {
    (void)self;
    const char *path = PyUnicode_AsUTF8(arg);
    if (path == NULL) {
        return NULL;
    }
    /* RTLD_NOLOAD: only a library already in the process (pyzmq's); never a second copy of libzmq. */
    void *lib = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (lib == NULL) {
        PyErr_Format(PyExc_OSError, "libzmq is not loaded from %s: %s", path, dlerror());
        return NULL;
    }
    version_fn version = (version_fn)dlsym(lib, "zmq_version");
    msg_init_fn init = (msg_init_fn)dlsym(lib, "zmq_msg_init");
    msg_recv_fn recv = (msg_recv_fn)dlsym(lib, "zmq_msg_recv");
    msg_close_fn close = (msg_close_fn)dlsym(lib, "zmq_msg_close");
    msg_data_fn data = (msg_data_fn)dlsym(lib, "zmq_msg_data");
    msg_size_fn size = (msg_size_fn)dlsym(lib, "zmq_msg_size");
    msg_more_fn more = (msg_more_fn)dlsym(lib, "zmq_msg_more");
    errno_fn err = (errno_fn)dlsym(lib, "zmq_errno");
    /* The library stays loaded by pyzmq; our reference keeps it so even if pyzmq were unloaded. */
    if (!version || !init || !recv || !close || !data || !size || !more || !err) {
        PyErr_Format(PyExc_OSError, "%s lacks the zmq_msg_* functions", path);
        return NULL;
    }
    int major = 0, minor = 0, patch = 0;
    version(&major, &minor, &patch);
    if (major != 4) {
        PyErr_Format(PyExc_OSError, "libzmq %d.%d.%d: zmq_msg_t layout is known for 4.x only", major, minor, patch);
        return NULL;
    }
    z.init = init;
    z.recv = recv;
    z.close = close;
    z.data = data;
    z.size = size;
    z.more = more;
    z.err = err;
    bound = 1;
    return Py_BuildValue("(iii)", major, minor, patch);
}

static PyObject *drain(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *handle_obj;
    Py_ssize_t max_messages;
    if (!PyArg_ParseTuple(args, "On", &handle_obj, &max_messages)) {
        return NULL;
    }
    if (!bound) {
        PyErr_SetString(PyExc_RuntimeError, "_zmqdrain.bind() was not called");
        return NULL;
    }
    void *sock = PyLong_AsVoidPtr(handle_obj);
    if (sock == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_ValueError, "null socket handle");
        }
        return NULL;
    }
    PyObject *payloads = PyList_New(0);
    if (payloads == NULL) {
        return NULL;
    }
    Py_ssize_t bad = 0;
    int stop_errno = 0;
    zmq_msg_t msg;
    for (Py_ssize_t n = 0; n < max_messages; n++) {
        int frames = 0;
        int seq_ok = 0;
        int more = 1;
        PyObject *payload = NULL;
        while (more) {
            z.init(&msg);
            if (z.recv(&msg, sock, ZMQ_DONTWAIT) < 0) {
                int e = z.err();
                z.close(&msg);
                /* ZMQ delivers a multipart message whole, so a dry socket shows at a message boundary. */
                if (frames > 0) {
                    bad++;
                }
                if (e != EAGAIN) {
                    stop_errno = e;
                }
                Py_XDECREF(payload);
                goto done;
            }
            more = z.more(&msg);
            if (frames == 1) {
                seq_ok = z.size(&msg) == 8;
            } else if (frames == 2) {
                payload = PyBytes_FromStringAndSize((const char *)z.data(&msg), (Py_ssize_t)z.size(&msg));
                if (payload == NULL) {
                    /* Out of memory: read the rest of this message so the socket stays aligned, then raise. */
                    while (more) {
                        z.close(&msg);
                        z.init(&msg);
                        if (z.recv(&msg, sock, ZMQ_DONTWAIT) < 0) {
                            break;
                        }
                        more = z.more(&msg);
                    }
                    z.close(&msg);
                    Py_DECREF(payloads);
                    return NULL;
                }
            }
            z.close(&msg);
            frames++;
        }
        if (frames == 3 && seq_ok) {
            int rc = PyList_Append(payloads, payload);
            Py_DECREF(payload);
            if (rc < 0) {
                Py_DECREF(payloads);
                return NULL;
            }
        } else {
            Py_XDECREF(payload);
            bad++;
        }
    }
done:;
    PyObject *result = Py_BuildValue("(Oni)", payloads, bad, stop_errno);
    Py_DECREF(payloads);
    return result;
}

static PyMethodDef methods[] = {
    {"bind", bind, METH_O, "bind(libzmq_path) -> (major, minor, patch): use the libzmq already loaded from that path."},
    {"drain", drain, METH_VARARGS,
     "drain(handle, max_messages) -> (payloads, bad_frames, errno): receive FPM messages without blocking."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_zmqdrain",
    .m_doc = "Batch receive of FPM messages from a pyzmq socket.",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__zmqdrain(void) { return PyModule_Create(&module); }
