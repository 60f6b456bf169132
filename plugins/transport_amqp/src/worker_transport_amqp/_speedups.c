/* A delivered message taken from the read buffer in one call: basic.deliver's method frame,
 * content header and body frames cut, checked and decoded into the values py-amqp's readers
 * would give (worker_transport_amqp.delivery holds the Python version and the contract).
 *
 * Anything this module does not read exactly as py-amqp does is declined (None), never
 * guessed: the caller then takes the frames one at a time through py-amqp's own code, which
 * keeps py-amqp's values for rare types and its errors for broken frames. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define FRAME_METHOD 1
#define FRAME_HEADER 2
#define FRAME_BODY 3
#define FRAME_END 0xCE
#define BASIC_CLASS 60
#define BASIC_DELIVER 60

/* Tables and arrays nested deeper than this are declined, so hostile input cannot exhaust the
 * C stack (Python's reader stops at its recursion limit instead). */
#define MAX_DEPTH 64

/* What a reader made of its input: a value, something left to Python, or a Python error. */
enum { FAILED = -1, DECLINED = 0, DONE = 1 };

typedef struct {
    const unsigned char *at;  /* the next byte to read */
    const unsigned char *end; /* the end of the frame's payload: nothing at or past it is read */
} Reader;

static inline int has(const Reader *r, uint64_t size) { return size <= (uint64_t)(r->end - r->at); }

static inline unsigned be16(const unsigned char *p) { return (unsigned)p[0] << 8 | p[1]; }

static inline uint32_t be32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static inline uint64_t be64(const unsigned char *p) { return (uint64_t)be32(p) << 32 | be32(p + 4); }

/* Two's complement readings written as arithmetic: converting an out-of-range unsigned value
 * to a signed type is implementation-defined in C. */
static inline long int8(unsigned v) { return (long)v - (v & 0x80 ? 0x100 : 0); }
static inline long int16(unsigned v) { return (long)v - (v & 0x8000 ? 0x10000 : 0); }
static inline long long int32(uint32_t v) { return (long long)v - (v & 0x80000000u ? 0x100000000LL : 0); }
static inline long long int64(uint64_t v) { return v <= INT64_MAX ? (long long)v : -(long long)~v - 1; }

#if PY_VERSION_HEX >= 0x030B0000
#define UNPACK4(p) PyFloat_Unpack4((const char *)(p), 0)
#define UNPACK8(p) PyFloat_Unpack8((const char *)(p), 0)
#else
#define UNPACK4(p) _PyFloat_Unpack4((p), 0)
#define UNPACK8(p) _PyFloat_Unpack8((p), 0)
#endif

static PyObject *float_of(double value) {
    /* struct's unpacking: -1.0 with an error set only on platforms that are not IEEE 754 */
    if (value == -1.0 && PyErr_Occurred()) {
        return NULL;
    }
    return PyFloat_FromDouble(value);
}

/* Long strings and table keys as py-amqp reads them: UTF-8 ("surrogatepass"), or the bytes. */
static PyObject *text_or_bytes(const unsigned char *p, Py_ssize_t size) {
    PyObject *text = PyUnicode_DecodeUTF8((const char *)p, size, "surrogatepass");
    if (text == NULL && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
        PyErr_Clear();
        return PyBytes_FromStringAndSize((const char *)p, size);
    }
    return text;
}

/* Table keys repeat from message to message (a Celery message has the same twenty): the last
 * string made for each slot is kept, with its hash, and reused when the same bytes come again. */
#define KEY_SLOTS 256
#define KEY_CACHED_MAX 32

static struct {
    PyObject *key; /* a str, or NULL */
    Py_ssize_t size;
    unsigned char bytes[KEY_CACHED_MAX];
} keys[KEY_SLOTS];

static PyObject *key_of(const unsigned char *p, Py_ssize_t size) {
    if (size == 0 || size > KEY_CACHED_MAX) {
        return text_or_bytes(p, size);
    }
    unsigned slot = ((unsigned)size * 31u + p[0] * 7u + p[size - 1] + p[size / 2] * 3u) % KEY_SLOTS;
    if (keys[slot].key != NULL && keys[slot].size == size && memcmp(keys[slot].bytes, p, (size_t)size) == 0) {
        return Py_NewRef(keys[slot].key);
    }
    PyObject *key = text_or_bytes(p, size);
    if (key == NULL || !PyUnicode_CheckExact(key)) {
        return key;
    }
    if (PyObject_Hash(key) == -1) {
        Py_DECREF(key);
        return NULL;
    }
    Py_XSETREF(keys[slot].key, Py_NewRef(key));
    keys[slot].size = size;
    memcpy(keys[slot].bytes, p, (size_t)size);
    return key;
}

static int read_value(Reader *r, int depth, PyObject **out);

/* py-amqp reads a table's or an array's items while its offset is short of the declared end,
 * wherever the last item ends: the same here, within the frame. */
static int read_table(Reader *r, int depth, PyObject **out) {
    if (depth > MAX_DEPTH || !has(r, 4)) {
        return DECLINED;
    }
    uint32_t size = be32(r->at);
    r->at += 4;
    if (!has(r, size)) {
        return DECLINED;
    }
    const unsigned char *end = r->at + size;
    PyObject *table = PyDict_New();
    if (table == NULL) {
        return FAILED;
    }
    while (r->at < end) {
        unsigned key_size = r->at[0];
        if (!has(r, 1 + (uint64_t)key_size)) {
            Py_DECREF(table);
            return DECLINED;
        }
        PyObject *key = key_of(r->at + 1, key_size);
        if (key == NULL) {
            Py_DECREF(table);
            return FAILED;
        }
        r->at += 1 + key_size;
        PyObject *value;
        int status = read_value(r, depth, &value);
        if (status == DONE) {
            status = PyDict_SetItem(table, key, value) == 0 ? DONE : FAILED;
            Py_DECREF(value);
        }
        Py_DECREF(key);
        if (status != DONE) {
            Py_DECREF(table);
            return status;
        }
    }
    *out = table;
    return DONE;
}

static int read_array(Reader *r, int depth, PyObject **out) {
    if (depth > MAX_DEPTH || !has(r, 4)) {
        return DECLINED;
    }
    uint32_t size = be32(r->at);
    r->at += 4;
    if (!has(r, size)) {
        return DECLINED;
    }
    const unsigned char *end = r->at + size;
    PyObject *array = PyList_New(0);
    if (array == NULL) {
        return FAILED;
    }
    while (r->at < end) {
        PyObject *value;
        int status = read_value(r, depth, &value);
        if (status == DONE) {
            status = PyList_Append(array, value) == 0 ? DONE : FAILED;
            Py_DECREF(value);
        }
        if (status != DONE) {
            Py_DECREF(array);
            return status;
        }
    }
    *out = array;
    return DONE;
}

/* One table or array item, each type letter as py-amqp's _read_item reads it (its 's' is
 * RabbitMQ's signed 16-bit integer; 'L' and 'l' are both signed 64-bit). */
static int read_value(Reader *r, int depth, PyObject **out) {
    if (!has(r, 1)) {
        return DECLINED;
    }
    unsigned char kind = *r->at++;
    const unsigned char *p = r->at;
    PyObject *value;
    uint64_t size;
    switch (kind) {
    case 'S':
    case 'x':
        if (!has(r, 4)) {
            return DECLINED;
        }
        size = be32(p);
        if (!has(r, 4 + size)) {
            return DECLINED;
        }
        value = kind == 'S' ? text_or_bytes(p + 4, (Py_ssize_t)size)
                            : PyBytes_FromStringAndSize((const char *)p + 4, (Py_ssize_t)size);
        size += 4;
        break;
    case 'V':
        value = Py_NewRef(Py_None);
        size = 0;
        break;
    case 't':
        size = 1;
        if (!has(r, size)) {
            return DECLINED;
        }
        value = PyBool_FromLong(p[0] != 0);
        break;
    case 'b':
    case 'B':
        size = 1;
        if (!has(r, size)) {
            return DECLINED;
        }
        value = PyLong_FromLong(kind == 'b' ? int8(p[0]) : (long)p[0]);
        break;
    case 's':
    case 'U':
    case 'u':
        size = 2;
        if (!has(r, size)) {
            return DECLINED;
        }
        value = PyLong_FromLong(kind == 'u' ? (long)be16(p) : int16(be16(p)));
        break;
    case 'I':
    case 'i':
        size = 4;
        if (!has(r, size)) {
            return DECLINED;
        }
        value = PyLong_FromLongLong(kind == 'i' ? (long long)be32(p) : int32(be32(p)));
        break;
    case 'L':
    case 'l':
        size = 8;
        if (!has(r, size)) {
            return DECLINED;
        }
        value = PyLong_FromLongLong(int64(be64(p)));
        break;
    case 'f':
        size = 4;
        if (!has(r, size)) {
            return DECLINED;
        }
        value = float_of(UNPACK4(p));
        break;
    case 'd':
        size = 8;
        if (!has(r, size)) {
            return DECLINED;
        }
        value = float_of(UNPACK8(p));
        break;
    case 'F':
        return read_table(r, depth + 1, out);
    case 'A':
        return read_array(r, depth + 1, out);
    default:
        /* 'D' (Decimal) and 'T' (datetime) are rare: py-amqp reads them; it refuses any other letter */
        return DECLINED;
    }
    if (value == NULL) {
        return FAILED;
    }
    r->at += size;
    *out = value;
    return DONE;
}

/* A short string of a method or of the basic properties: py-amqp raises for one that is not
 * UTF-8, so that one is left to py-amqp. */
static int read_short_string(Reader *r, PyObject **out) {
    if (!has(r, 1) || !has(r, 1 + (uint64_t)r->at[0])) {
        return DECLINED;
    }
    Py_ssize_t size = r->at[0];
    PyObject *text = PyUnicode_DecodeUTF8((const char *)r->at + 1, size, "surrogatepass");
    if (text == NULL) {
        if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
            PyErr_Clear();
            return DECLINED;
        }
        return FAILED;
    }
    r->at += 1 + size;
    *out = text;
    return DONE;
}

/* The basic class's properties, by flag bit, in the order py-amqp decodes them. */
static struct {
    unsigned bit;
    char kind; /* s: short string, F: table, o: octet, T: 64-bit unsigned timestamp */
    const char *name;
    PyObject *key; /* the name, interned when the module is loaded */
} property_fields[] = {
    {0x8000, 's', "content_type", NULL},  {0x4000, 's', "content_encoding", NULL},
    {0x2000, 'F', "application_headers", NULL},
    {0x1000, 'o', "delivery_mode", NULL}, {0x0800, 'o', "priority", NULL},
    {0x0400, 's', "correlation_id", NULL}, {0x0200, 's', "reply_to", NULL},
    {0x0100, 's', "expiration", NULL},    {0x0080, 's', "message_id", NULL},
    {0x0040, 'T', "timestamp", NULL},     {0x0020, 's', "type", NULL},
    {0x0010, 's', "user_id", NULL},       {0x0008, 's', "app_id", NULL},
    {0x0004, 's', "cluster_id", NULL},
};

#define PROPERTY_COUNT (sizeof(property_fields) / sizeof(property_fields[0]))

static int read_properties(Reader *r, PyObject **out) {
    if (!has(r, 2)) {
        return DECLINED;
    }
    unsigned flags = be16(r->at);
    r->at += 2;
    PyObject *decoded = PyDict_New();
    if (decoded == NULL) {
        return FAILED;
    }
    for (size_t i = 0; i < PROPERTY_COUNT; i++) {
        if (!(flags & property_fields[i].bit)) {
            continue;
        }
        PyObject *value = NULL;
        int status = DONE;
        switch (property_fields[i].kind) {
        case 's':
            status = read_short_string(r, &value);
            break;
        case 'F':
            status = read_table(r, 1, &value);
            break;
        case 'o':
            if (!has(r, 1)) {
                status = DECLINED;
                break;
            }
            value = PyLong_FromLong(r->at[0]);
            r->at += 1;
            status = value == NULL ? FAILED : DONE;
            break;
        default: /* 'T' */
            if (!has(r, 8)) {
                status = DECLINED;
                break;
            }
            value = PyLong_FromUnsignedLongLong(be64(r->at));
            r->at += 8;
            status = value == NULL ? FAILED : DONE;
            break;
        }
        if (status == DONE) {
            status = PyDict_SetItem(decoded, property_fields[i].key, value) == 0 ? DONE : FAILED;
            Py_DECREF(value);
        }
        if (status != DONE) {
            Py_DECREF(decoded);
            return status;
        }
    }
    *out = decoded;
    return DONE;
}

typedef struct {
    unsigned type;
    unsigned channel;
    const unsigned char *payload;
    uint32_t size;
} Frame;

/* The frame at *offset if the buffer holds all of it, with its frame end; moves *offset past it. */
static int next_frame(const unsigned char *buffer, Py_ssize_t length, Py_ssize_t *offset, Frame *frame) {
    if (length - *offset < 8) {
        return 0;
    }
    const unsigned char *p = buffer + *offset;
    uint32_t size = be32(p + 3);
    if ((uint64_t)size + 8 > (uint64_t)(length - *offset) || p[7 + (size_t)size] != FRAME_END) {
        return 0;
    }
    frame->type = p[0];
    frame->channel = be16(p + 1);
    frame->payload = p + 7;
    frame->size = size;
    *offset += (Py_ssize_t)size + 8;
    return 1;
}

enum {
    END, CHANNEL, METHOD_PAYLOAD, CONSUMER_TAG, DELIVERY_TAG, REDELIVERED, EXCHANGE, ROUTING_KEY,
    PROPERTIES, BODY, FRAME_COUNT, RESULT_SIZE
};

/* The body: one frame's payload, the payloads of several joined, or "" when there is none.
 * (next_delivery has checked every one of these frames.) */
static PyObject *read_body(const unsigned char *buffer, Py_ssize_t length, Py_ssize_t offset, uint64_t size,
                           Py_ssize_t frames) {
    if (size == 0) {
        return PyUnicode_New(0, 0); /* py-amqp's body for a message without one */
    }
    Frame frame;
    if (frames == 1) {
        if (!next_frame(buffer, length, &offset, &frame)) {
            return PyErr_Format(PyExc_SystemError, "no body frame at %zd", offset);
        }
        return PyBytes_FromStringAndSize((const char *)frame.payload, frame.size);
    }
    PyObject *body = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)size);
    if (body == NULL) {
        return NULL;
    }
    char *into = PyBytes_AS_STRING(body);
    for (Py_ssize_t i = 0; i < frames; i++) {
        if (!next_frame(buffer, length, &offset, &frame)) {
            Py_DECREF(body);
            return PyErr_Format(PyExc_SystemError, "no body frame at %zd", offset);
        }
        memcpy(into, frame.payload, frame.size);
        into += frame.size;
    }
    return body;
}

/* basic.deliver's arguments (short string, 64-bit tag, bit, short string, short string) and
 * the content header's properties, each frame read to its last byte. */
static int read_deliver(const Frame *method, const Frame *header, PyObject **items) {
    Reader r = {method->payload + 4, method->payload + method->size};
    int status = read_short_string(&r, &items[CONSUMER_TAG]);
    if (status != DONE) {
        return status;
    }
    if (!has(&r, 9)) {
        return DECLINED;
    }
    if ((items[DELIVERY_TAG] = PyLong_FromUnsignedLongLong(be64(r.at))) == NULL) {
        return FAILED;
    }
    items[REDELIVERED] = PyBool_FromLong(r.at[8] & 1);
    r.at += 9;
    if ((status = read_short_string(&r, &items[EXCHANGE])) != DONE ||
        (status = read_short_string(&r, &items[ROUTING_KEY])) != DONE) {
        return status;
    }
    if (r.at != r.end) {
        return DECLINED;
    }
    r.at = header->payload + 12;
    r.end = header->payload + header->size;
    if ((status = read_properties(&r, &items[PROPERTIES])) != DONE) {
        return status;
    }
    return r.at == r.end ? DONE : DECLINED;
}

PyDoc_STRVAR(next_delivery_doc,
"next_delivery(buffer, /)\n--\n\n"
"The basic.deliver message at the start of ``buffer`` (its method, content header and body\n"
"frames) as ``(end, channel_id, method_payload, consumer_tag, delivery_tag, redelivered,\n"
"exchange, routing_key, properties, body, frame_count)``; None if the buffer does not start\n"
"with a whole, well-formed one that this function reads exactly as py-amqp does.");

static PyObject *next_delivery(PyObject *module, PyObject *arg) {
    (void)module;
    if (!PyBytes_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "next_delivery() needs bytes (got %.200s)", Py_TYPE(arg)->tp_name);
        return NULL;
    }
    const unsigned char *buffer = (const unsigned char *)PyBytes_AS_STRING(arg);
    Py_ssize_t length = PyBytes_GET_SIZE(arg), offset = 0;
    Frame method, header, body;
    if (!next_frame(buffer, length, &offset, &method) || method.type != FRAME_METHOD || method.size < 4 ||
        be16(method.payload) != BASIC_CLASS || be16(method.payload + 2) != BASIC_DELIVER) {
        Py_RETURN_NONE;
    }
    if (!next_frame(buffer, length, &offset, &header) || header.type != FRAME_HEADER ||
        header.channel != method.channel || header.size < 12 || be16(header.payload) != BASIC_CLASS) {
        Py_RETURN_NONE;
    }
    Py_ssize_t body_offset = offset, body_frames = 0;
    uint64_t body_size = be64(header.payload + 4), received = 0;
    while (received < body_size) {
        if (!next_frame(buffer, length, &offset, &body) || body.type != FRAME_BODY ||
            body.channel != method.channel) {
            Py_RETURN_NONE;
        }
        received += body.size;
        body_frames++;
    }
    if (received != body_size) {
        Py_RETURN_NONE;
    }

    PyObject *items[RESULT_SIZE] = {NULL};
    PyObject *result = NULL;
    int status = read_deliver(&method, &header, items);
    if (status == DONE &&
        ((items[END] = PyLong_FromSsize_t(offset)) == NULL ||
         (items[CHANNEL] = PyLong_FromLong((long)method.channel)) == NULL ||
         (items[METHOD_PAYLOAD] = PyBytes_FromStringAndSize((const char *)method.payload, method.size)) == NULL ||
         (items[BODY] = read_body(buffer, length, body_offset, body_size, body_frames)) == NULL ||
         (items[FRAME_COUNT] = PyLong_FromSsize_t(2 + body_frames)) == NULL ||
         (result = PyTuple_New(RESULT_SIZE)) == NULL)) {
        status = FAILED;
    }
    for (int i = 0; i < RESULT_SIZE; i++) {
        if (result != NULL) {
            PyTuple_SET_ITEM(result, i, items[i]); /* (the tuple takes the reference) */
        } else {
            Py_XDECREF(items[i]);
        }
    }
    if (status == FAILED) {
        return NULL;
    }
    if (result == NULL) {
        Py_RETURN_NONE;
    }
    return result;
}

static PyMethodDef methods[] = {
    {"next_delivery", next_delivery, METH_O, next_delivery_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "worker_transport_amqp._speedups",
    .m_doc = "basic.deliver messages taken whole from the read buffer (see worker_transport_amqp.delivery).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__speedups(void) {
    for (size_t i = 0; i < PROPERTY_COUNT; i++) {
        if (property_fields[i].key == NULL && (property_fields[i].key = PyUnicode_InternFromString(property_fields[i].name)) == NULL) {
            return NULL;
        }
    }
    return PyModule_Create(&module);
}
