/* The queue model's common case in C: CmqQueue.send / receive / delete (issue 31 aim 1).
 *
 * Why: a fanout delivery (scenario 3) spent over half its instructions in the interpreter's
 * own loop, and these three methods were the largest part of it (one send, one receive, one
 * delete a delivery: ~40 attribute reads and writes each, docs/BENCHMARKS.md). Here each reads
 * and writes the queue's and the message's slots at their offsets.
 *
 * The reference is semantics.queue's Python methods (py_send, py_receive, py_delete), which
 * stay the model: each function here first checks, without changing anything, that the call
 * is the plain case it knows (see each one); anything else (a delay, a TTL, x-max-length, a
 * dead-letter policy's time to live, priorities, cold runs, a timer due, a lane to compact or
 * a fold to run, an argument of another type) is handed to the Python method unchanged. The
 * plain case then does what the Python method does, in its order, with the same objects.
 * tests/unit/broker/test_queue_compiled.py runs random sequences of operations through a
 * queue with these and one with the Python methods and holds them to the same state, results
 * and events.
 *
 *   configure(CmqQueue, QueueMessage, Receipt, py_send, py_receive, py_delete, states, kinds,
 *             py_restore_plain, min_compact)
 *       -> {"send": descriptor, "receive": descriptor, "delete": descriptor, "restore_plain": descriptor}
 *   states: (ACTIVE, INACTIVE, DELETED, REMOVED); kinds: the timer kinds (_VISIBLE, _DEADLINE).
 *   The descriptors are methods of CmqQueue (semantics.queue.use_compiled puts them on the
 *   class).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

/* CmqQueue's slots read or written here. */
enum { Q_MESSAGES, Q_ACTIVE, Q_RETURNED, Q_ACTIVE_STALE, Q_VIS, Q_DL, Q_VIS_LIMIT, Q_DL_LIMIT, Q_NEXT_DUE,
       Q_HANDLES, Q_NEXT_POS, Q_NEXT_SEQ, Q_N_ACTIVE, Q_N_INACTIVE, Q_N_REWINDABLE, Q_N_COLD, Q_FOLD_AT,
       Q_PRIORITY_OF, Q_VT, Q_RETENTION, Q_MAX_SIZE, Q_HEAP_NUM, Q_DEFAULT_DELAY, Q_TTL, Q_MAX_LENGTH,
       Q_DLQ_TTL, Q_REWIND, Q_DLQ, Q_COUNT };
static const char *q_names[Q_COUNT] = {
    "_messages", "_active", "_returned", "_active_stale", "_vis", "_dl", "_vis_limit", "_dl_limit", "_next_due",
    "_handles", "_next_pos", "_next_seq", "_n_active", "_n_inactive", "_n_rewindable", "_n_cold", "_fold_at",
    "_priority_of", "_vt", "_retention", "_max_size", "_heap_num", "_default_delay", "_ttl", "_max_length",
    "_dlq_ttl", "_rewind", "_dlq"};

/* QueueMessage's slots, in the order of its __init__'s stores. */
enum { M_MSG_ID, M_PAYLOAD, M_SIZE, M_ENQUEUE_TIME, M_FIRST_RECEIVE_TIME, M_NEXT_VISIBLE_TIME,
       M_RECEIVE_COUNT, M_STATE, M_EXPIRES_AT, M_HANDLE, M_POS, M_SEQ, M_DEADLINE, M_COUNT };
static const char *m_names[M_COUNT] = {
    "msg_id", "payload", "size", "enqueue_time", "first_receive_time", "next_visible_time", "receive_count",
    "state", "expires_at", "handle", "pos", "seq", "deadline"};

static Py_ssize_t q_off[Q_COUNT], m_off[M_COUNT];
static PyTypeObject *queue_t, *message_t, *receipt_t;
static PyObject *py_send, *py_receive, *py_delete, *py_restore_plain;
static Py_ssize_t min_compact;  /* semantics.queue._MIN_COMPACT: _active's compaction threshold */
static PyObject *s_active, *s_inactive, *s_deleted, *s_removed;
static PyObject *kind_visible, *kind_deadline, *zero, *s_emptied;
/* collections.deque's own append and popleft (its type is not public): called directly, not
 * through a method lookup each time. */
static PyTypeObject *deque_t;
static PyCFunction deque_append, deque_popleft;

#define QS(q, i) (*(PyObject **)((char *)(q) + q_off[i]))
#define MS(m, i) (*(PyObject **)((char *)(m) + m_off[i]))

/* A slot's value replaced (the old one released after the store, as setattr does). */
static inline void put(PyObject **at, PyObject *value) {
    PyObject *old = *at;
    *at = value;  /* a new reference, given */
    Py_XDECREF(old);
}

/* An int slot's value, or -1 with ok cleared (not an exact int in range: the Python path). */
static inline Py_ssize_t int_of(PyObject *v, int *ok) {
    if (v == NULL || !PyLong_CheckExact(v)) { *ok = 0; return -1; }
    Py_ssize_t n = PyLong_AsSsize_t(v);
    if (n == -1 && PyErr_Occurred()) { PyErr_Clear(); *ok = 0; }
    return n;
}

static inline int float_of(PyObject *v, double *out) {
    if (v == NULL || !PyFloat_CheckExact(v)) return 0;
    *out = PyFloat_AS_DOUBLE(v);
    return 1;
}

/* An int slot set to n (a new int; small ones are shared). */
static inline int put_int(PyObject *obj, Py_ssize_t off, Py_ssize_t n) {
    PyObject *v = PyLong_FromSsize_t(n);
    if (v == NULL) return -1;
    put((PyObject **)((char *)obj + off), v);
    return 0;
}

/* The time of a lane entry (when, kind, msg, token), or 0 when it is not a tuple with a float
 * first. */
static inline int entry_time(PyObject *e, double *out) {
    return e != NULL && PyTuple_CheckExact(e) && PyTuple_GET_SIZE(e) == 4 && float_of(PyTuple_GET_ITEM(e, 0), out);
}

/* Whether an entry at ``when`` goes to the end of the FIFO lane (its last entry is not later)
 * and leaves it within ``limit`` entries (beyond, the Python method compacts the lane). */
static int appends(PyObject *lane, double when, Py_ssize_t limit) {
    Py_ssize_t n = Py_SIZE(lane);
    double last;
    if (n + 1 > limit) return 0;
    if (n == 0) return 1;
    PyObject *e = PySequence_GetItem(lane, n - 1);
    if (e == NULL) {
        PyErr_Clear();
        return 0;
    }
    int got = entry_time(e, &last);
    Py_DECREF(e);
    return got && last <= when;
}

/* The entry (when, kind, msg, token) appended to a lane (``appends`` said it may be), and the
 * queue's _next_due lowered to ``when`` if it is earlier. */
static int push(PyObject *self, PyObject *lane, PyObject *when, double next_due, PyObject *kind, PyObject *msg,
                PyObject *token) {
    PyObject *entry = PyTuple_Pack(4, when, kind, msg, token);
    if (entry == NULL) return -1;
    PyObject *r = deque_append(lane, entry);
    Py_DECREF(entry);
    if (r == NULL) return -1;
    Py_DECREF(r);
    if (PyFloat_AS_DOUBLE(when) < next_due) put(&QS(self, Q_NEXT_DUE), Py_NewRef(when));
    return 0;
}

/* The Python method itself, with the same arguments. */
static PyObject *reference(PyObject *func, PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                           PyObject *kwnames) {
    PyObject *stack[17];
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    if (nargs + nkw > 16) {
        /* Never the broker's calls; a call this long is Python's to refuse or take. */
        PyObject *bound = PyMethod_New(func, self);
        if (bound == NULL) return NULL;
        PyObject *out = PyObject_Vectorcall(bound, args, nargs, kwnames);
        Py_DECREF(bound);
        return out;
    }
    stack[0] = self;
    for (Py_ssize_t i = 0; i < nargs + nkw; i++) stack[i + 1] = args[i];
    return PyObject_Vectorcall(func, stack, (size_t)(nargs + 1), kwnames);
}

static inline int is_deque(PyObject *d) { return d != NULL && Py_IS_TYPE(d, deque_t); }

/* send's and restore_plain's common steps, in their order, once the plain case is known: a
 * QueueMessage (Active, enqueued at ``enq``, visible from ``now``, its deadline ``when``) into
 * _messages, the deadline lane's end and the Active order's end; _next_seq, _next_pos and
 * _n_active advanced. The queue's _messages, _dl and _active were checked by the caller. */
static PyObject *enter(PyObject *self, PyObject *msg_id, PyObject *payload, PyObject *size, PyObject *enq,
                       PyObject *now, double when, Py_ssize_t seq, Py_ssize_t pos, Py_ssize_t n_active,
                       double next_due) {
    PyObject *when_o = PyFloat_FromDouble(when);
    PyObject *seq_o = PyLong_FromSsize_t(seq), *pos_o = PyLong_FromSsize_t(pos);
    PyObject *msg = message_t->tp_alloc(message_t, 0);
    if (when_o == NULL || seq_o == NULL || pos_o == NULL || msg == NULL) goto fail;
    PyObject *values[M_COUNT] = {msg_id, payload, size, enq, Py_None, now, zero, s_active, Py_None, zero,
                                 pos_o, seq_o, when_o};
    for (int i = 0; i < M_COUNT; i++) {
        Py_INCREF(values[i]);
        put(&MS(msg, i), values[i]);
    }
    if (put_int(self, q_off[Q_NEXT_SEQ], seq + 1) < 0 || PyDict_SetItem(QS(self, Q_MESSAGES), msg_id, msg) < 0)
        goto fail;
    if (push(self, QS(self, Q_DL), when_o, next_due, kind_deadline, msg, zero) < 0
            || put_int(self, q_off[Q_NEXT_POS], pos + 1) < 0)
        goto fail;
    PyObject *r = deque_append(QS(self, Q_ACTIVE), msg);
    if (r == NULL) goto fail;
    Py_DECREF(r);
    if (put_int(self, q_off[Q_N_ACTIVE], n_active + 1) < 0) goto fail;
    Py_DECREF(when_o);
    Py_DECREF(seq_o);
    Py_DECREF(pos_o);
    return msg;
fail:
    Py_XDECREF(when_o);
    Py_XDECREF(seq_o);
    Py_XDECREF(pos_o);
    Py_XDECREF(msg);
    return NULL;
}

/* send(payload, size, now, delay=None, msg_id=None, expires_at=None): the plain case is a
 * message with its own ID given, no delay (given or the queue's), no TTL (its own or the
 * queue's), into a queue without x-max-length, dead-letter time to live, priorities or cold
 * runs, no timer due, the deadline lane in order and neither it nor the Active order at its
 * compaction or fold limit. */
static PyObject *q_send(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    if (kwnames != NULL || nargs < 3 || nargs > 6 || !Py_IS_TYPE(self, queue_t)) goto python;
    PyObject *payload = args[0], *size = args[1], *now_o = args[2];
    PyObject *delay = nargs > 3 ? args[3] : Py_None, *msg_id = nargs > 4 ? args[4] : Py_None;
    PyObject *expires_at = nargs > 5 ? args[5] : Py_None;
    double now, next_due, retention, default_delay;
    int ok = 1;
    if (delay != Py_None || expires_at != Py_None || !PyUnicode_CheckExact(msg_id) || !PyLong_CheckExact(size)
            || !float_of(now_o, &now))
        goto python;
    Py_ssize_t n_size = int_of(size, &ok), max_size = int_of(QS(self, Q_MAX_SIZE), &ok);
    if (!ok || n_size > max_size) goto python;
    if (!float_of(QS(self, Q_NEXT_DUE), &next_due) || next_due <= now) goto python;
    PyObject *messages = QS(self, Q_MESSAGES), *dl = QS(self, Q_DL), *active = QS(self, Q_ACTIVE);
    if (messages == NULL || !PyDict_CheckExact(messages) || !is_deque(dl) || !is_deque(active)) goto python;
    Py_ssize_t held = PyDict_GET_SIZE(messages) - int_of(QS(self, Q_N_REWINDABLE), &ok);
    Py_ssize_t heap_num = int_of(QS(self, Q_HEAP_NUM), &ok);
    Py_ssize_t n_cold = int_of(QS(self, Q_N_COLD), &ok);
    Py_ssize_t dl_limit = int_of(QS(self, Q_DL_LIMIT), &ok), fold_at = int_of(QS(self, Q_FOLD_AT), &ok);
    Py_ssize_t seq = int_of(QS(self, Q_NEXT_SEQ), &ok), pos = int_of(QS(self, Q_NEXT_POS), &ok);
    Py_ssize_t n_active = int_of(QS(self, Q_N_ACTIVE), &ok);
    if (!ok || held >= heap_num || n_cold != 0 || seq == PY_SSIZE_T_MAX || pos == PY_SSIZE_T_MAX) goto python;
    if (!float_of(QS(self, Q_DEFAULT_DELAY), &default_delay) || default_delay > 0 || default_delay != default_delay)
        goto python;
    if (QS(self, Q_TTL) != Py_None || QS(self, Q_MAX_LENGTH) != Py_None || QS(self, Q_DLQ_TTL) != Py_None
            || QS(self, Q_PRIORITY_OF) != Py_None || !float_of(QS(self, Q_RETENTION), &retention))
        goto python;
    int known = PyDict_Contains(messages, msg_id);
    if (known != 0) {
        if (known < 0) PyErr_Clear();
        goto python;  /* Q3's refusal is the model's */
    }
    double when = now + retention;
    if (!appends(dl, when, dl_limit) || Py_SIZE(active) + 1 > fold_at) goto python;

    /* The plain case: nothing changed so far, everything below succeeds but for memory. */
    return enter(self, msg_id, payload, size, now_o, now_o, when, seq, pos, n_active, next_due);
python:
    return reference(py_send, self, args, nargs, kwnames);
}

/* receive(now, visibility=None): the plain case takes the head of the Active order (no
 * message put back before it, no cold run), with the queue's visibility timeout, no timer
 * due, the visibility lane in order and not at its compaction limit. */
static PyObject *q_receive(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    if (kwnames != NULL || nargs < 1 || nargs > 2 || !Py_IS_TYPE(self, queue_t)) goto python;
    if (nargs == 2 && args[1] != Py_None) goto python;
    PyObject *now_o = args[0];
    double now, next_due, vt;
    int ok = 1;
    if (!float_of(now_o, &now) || !float_of(QS(self, Q_NEXT_DUE), &next_due) || next_due <= now) goto python;
    PyObject *active = QS(self, Q_ACTIVE), *returned = QS(self, Q_RETURNED), *vis = QS(self, Q_VIS);
    PyObject *handles = QS(self, Q_HANDLES);
    if (!is_deque(active) || !is_deque(vis) || returned == NULL || !PyList_CheckExact(returned)
            || PyList_GET_SIZE(returned) != 0 || handles == NULL || Py_TYPE(handles)->tp_iternext == NULL)
        goto python;
    Py_ssize_t n_cold = int_of(QS(self, Q_N_COLD), &ok), vis_limit = int_of(QS(self, Q_VIS_LIMIT), &ok);
    Py_ssize_t n_active = int_of(QS(self, Q_N_ACTIVE), &ok), n_inactive = int_of(QS(self, Q_N_INACTIVE), &ok);
    if (!ok || n_cold != 0) goto python;
    if (Py_SIZE(active) == 0) Py_RETURN_NONE;  /* nothing Active: a dispatch's last look */
    if (!float_of(QS(self, Q_VT), &vt)) goto python;
    PyObject *msg = PySequence_GetItem(active, 0);
    if (msg == NULL) {
        PyErr_Clear();
        goto python;
    }
    Py_DECREF(msg);  /* the deque holds it until popleft below */
    if (!Py_IS_TYPE(msg, message_t) || MS(msg, M_STATE) != s_active) goto python;
    PyObject *count = MS(msg, M_RECEIVE_COUNT);
    Py_ssize_t receive_count = int_of(count, &ok);
    if (!ok || receive_count == PY_SSIZE_T_MAX || MS(msg, M_FIRST_RECEIVE_TIME) == NULL) goto python;
    double visible = now + vt;
    if (!appends(vis, visible, vis_limit)) goto python;

    PyObject *visible_o = PyFloat_FromDouble(visible);
    if (visible_o == NULL) return NULL;
    PyObject *handle = Py_TYPE(handles)->tp_iternext(handles);
    if (handle == NULL) {
        Py_DECREF(visible_o);
        if (!PyErr_Occurred()) PyErr_SetNone(PyExc_StopIteration);
        return NULL;
    }
    PyObject *popped = deque_popleft(active, NULL);
    if (popped == NULL) goto fail;
    /* msg: the reference popleft gave, owned here from now on */
    put(&MS(msg, M_STATE), Py_NewRef(s_inactive));
    if (put_int(msg, m_off[M_RECEIVE_COUNT], receive_count + 1) < 0) goto fail_msg;
    if (MS(msg, M_FIRST_RECEIVE_TIME) == Py_None) put(&MS(msg, M_FIRST_RECEIVE_TIME), Py_NewRef(now_o));
    put(&MS(msg, M_NEXT_VISIBLE_TIME), Py_NewRef(visible_o));
    put(&MS(msg, M_HANDLE), Py_NewRef(handle));
    if (put_int(self, q_off[Q_N_ACTIVE], n_active - 1) < 0
            || put_int(self, q_off[Q_N_INACTIVE], n_inactive + 1) < 0)
        goto fail_msg;
    if (push(self, vis, visible_o, next_due, kind_visible, msg, handle) < 0) goto fail_msg;
    Py_DECREF(visible_o);
    PyObject *receipt = receipt_t->tp_alloc(receipt_t, 2);
    if (receipt == NULL) {
        Py_DECREF(msg);
        Py_DECREF(handle);
        return NULL;
    }
    PyTuple_SET_ITEM(receipt, 0, msg);     /* the references popleft and the counter gave */
    PyTuple_SET_ITEM(receipt, 1, handle);
    return receipt;
fail_msg:
    Py_DECREF(msg);
fail:
    Py_DECREF(visible_o);
    Py_DECREF(handle);
    return NULL;
python:
    return reference(py_receive, self, args, nargs, kwnames);
}

/* A lane's head entry goes when it is ``msg``'s (``if lane and lane[0][2] is msg: lane.popleft()``). */
static int drop_head(PyObject *lane, PyObject *msg) {
    if (!Py_SIZE(lane)) return 0;
    PyObject *e = PySequence_GetItem(lane, 0);
    if (e == NULL) return -1;
    int head = PyTuple_CheckExact(e) && PyTuple_GET_SIZE(e) == 4 && PyTuple_GET_ITEM(e, 2) == msg;
    Py_DECREF(e);
    if (!head) return 0;
    PyObject *r = deque_popleft(lane, NULL);
    if (r == NULL) return -1;
    Py_DECREF(r);
    return 0;
}

/* delete(receipt, now): the plain case is a receipt of two items naming a QueueMessage and
 * no timer due; the rest (a stale handle, a message not Active or Inactive, Q6's rewindable
 * copy, the message ID's removal) is the Python method's, step for step. */
static PyObject *q_delete(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    if (kwnames != NULL || nargs != 2 || !Py_IS_TYPE(self, queue_t)) goto python;
    PyObject *receipt = args[0];
    double now, next_due, rewind;
    int ok = 1;
    if (!PyTuple_Check(receipt) || PyTuple_GET_SIZE(receipt) != 2 || !float_of(args[1], &now)) goto python;
    PyObject *msg = PyTuple_GET_ITEM(receipt, 0), *handle = PyTuple_GET_ITEM(receipt, 1);
    if (!Py_IS_TYPE(msg, message_t) || !PyLong_CheckExact(handle)) goto python;
    if (!float_of(QS(self, Q_NEXT_DUE), &next_due) || next_due <= now) goto python;
    PyObject *vis = QS(self, Q_VIS), *dl = QS(self, Q_DL), *messages = QS(self, Q_MESSAGES);
    PyObject *held = MS(msg, M_HANDLE), *state = MS(msg, M_STATE), *msg_id = MS(msg, M_MSG_ID);
    if (!is_deque(vis) || !is_deque(dl) || messages == NULL || !PyDict_CheckExact(messages) || held == NULL
            || !PyLong_CheckExact(held) || state == NULL || msg_id == NULL || !float_of(QS(self, Q_REWIND), &rewind))
        goto python;
    Py_ssize_t n_active = int_of(QS(self, Q_N_ACTIVE), &ok), n_inactive = int_of(QS(self, Q_N_INACTIVE), &ok);
    Py_ssize_t stale = int_of(QS(self, Q_ACTIVE_STALE), &ok), n_rewindable = int_of(QS(self, Q_N_REWINDABLE), &ok);
    Py_ssize_t n_cold = int_of(QS(self, Q_N_COLD), &ok);
    if (!ok) goto python;
    int same = PyObject_RichCompareBool(held, handle, Py_EQ);  /* two exact ints: no error */
    if (same < 0) return NULL;
    if (!same) Py_RETURN_FALSE;
    if (state == s_inactive) {
        if (put_int(self, q_off[Q_N_INACTIVE], n_inactive - 1) < 0) return NULL;
    } else if (state == s_active) {
        if (put_int(self, q_off[Q_N_ACTIVE], n_active - 1) < 0
                || put_int(self, q_off[Q_ACTIVE_STALE], stale + 1) < 0)
            return NULL;
    } else {
        Py_RETURN_FALSE;
    }
    put(&MS(msg, M_HANDLE), Py_NewRef(zero));
    if (drop_head(vis, msg) < 0) return NULL;
    if (rewind > 0) {
        put(&MS(msg, M_STATE), Py_NewRef(s_deleted));  /* Q6: kept until its retention ends */
        if (put_int(self, q_off[Q_N_REWINDABLE], n_rewindable + 1) < 0) return NULL;
        Py_RETURN_TRUE;
    }
    put(&MS(msg, M_STATE), Py_NewRef(s_removed));
    if (drop_head(dl, msg) < 0) return NULL;
    Py_INCREF(msg_id);
    int gone = PyDict_DelItem(messages, msg_id);
    Py_DECREF(msg_id);
    if (gone < 0) return NULL;  /* KeyError, as ``del self._messages[msg.msg_id]`` */
    if (PyDict_GET_SIZE(messages) == 0 && n_cold == 0) {
        PyObject *r = PyObject_CallMethodNoArgs(self, s_emptied);
        if (r == NULL) return NULL;
        Py_DECREF(r);
    }
    Py_RETURN_TRUE;
python:
    return reference(py_delete, self, args, nargs, kwnames);
}

/* restore_plain(payload, size, now, msg_id, enqueue_time): a pulled message into the local
 * model (JetStream only, once a message, issue 28 aim 1). The plain case: no dead-letter policy
 * or its time to live, no priorities, no cold runs, an ID not in the queue, exact float times,
 * the retention end appended in order to the deadline lane within its limit, no x-max-length,
 * no compaction of the Active order due and no timer due once the deadline is in. Anything else
 * (the Python method would call restore, _push_timer, _compact_lane, _drop_over_max_length,
 * _compact_active or _advance, or raise Q3) is py_restore_plain's, unchanged. */
static PyObject *q_restore_plain(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    if (kwnames != NULL || nargs != 5 || !Py_IS_TYPE(self, queue_t)) goto python;
    PyObject *payload = args[0], *size = args[1], *now_o = args[2], *msg_id = args[3], *enq_o = args[4];
    double now, enq, next_due, retention;
    int ok = 1;
    if (!PyUnicode_CheckExact(msg_id) || !float_of(now_o, &now) || !float_of(enq_o, &enq)) goto python;
    if (QS(self, Q_DLQ) != Py_None || QS(self, Q_DLQ_TTL) != Py_None || QS(self, Q_PRIORITY_OF) != Py_None
            || QS(self, Q_MAX_LENGTH) != Py_None || !float_of(QS(self, Q_RETENTION), &retention)
            || !float_of(QS(self, Q_NEXT_DUE), &next_due))
        goto python;
    PyObject *messages = QS(self, Q_MESSAGES), *dl = QS(self, Q_DL), *active = QS(self, Q_ACTIVE);
    PyObject *returned = QS(self, Q_RETURNED);
    if (messages == NULL || !PyDict_CheckExact(messages) || !is_deque(dl) || !is_deque(active) || returned == NULL
            || !PyList_CheckExact(returned))
        goto python;
    Py_ssize_t n_cold = int_of(QS(self, Q_N_COLD), &ok), dl_limit = int_of(QS(self, Q_DL_LIMIT), &ok);
    Py_ssize_t seq = int_of(QS(self, Q_NEXT_SEQ), &ok), pos = int_of(QS(self, Q_NEXT_POS), &ok);
    Py_ssize_t n_active = int_of(QS(self, Q_N_ACTIVE), &ok), stale = int_of(QS(self, Q_ACTIVE_STALE), &ok);
    if (!ok || n_cold != 0 || seq == PY_SSIZE_T_MAX || pos == PY_SSIZE_T_MAX || n_active == PY_SSIZE_T_MAX)
        goto python;
    /* _compact_active's test, on the lengths after the append */
    if (stale > min_compact && stale * 2 > Py_SIZE(active) + 1 + PyList_GET_SIZE(returned))
        goto python;
    double when = enq + retention;
    /* _advance: due when the lower of _next_due and the new deadline is not after now */
    if (!(next_due > now) || !(when > now) || !appends(dl, when, dl_limit)) goto python;
    int known = PyDict_Contains(messages, msg_id);
    if (known != 0) {
        if (known < 0) PyErr_Clear();
        goto python;  /* Q3's refusal is the model's */
    }

    /* The plain case: nothing changed so far, everything below succeeds but for memory. */
    return enter(self, msg_id, payload, size, enq_o, now_o, when, seq, pos, n_active, next_due);
python:
    return reference(py_restore_plain, self, args, nargs, kwnames);
}

static PyMethodDef queue_methods[] = {
    {"send", (PyCFunction)(void (*)(void))q_send, METH_FASTCALL | METH_KEYWORDS,
     "CmqQueue.send; the plain case compiled (gateway/broker/_queue.c)."},
    {"receive", (PyCFunction)(void (*)(void))q_receive, METH_FASTCALL | METH_KEYWORDS,
     "CmqQueue.receive; the plain case compiled (gateway/broker/_queue.c)."},
    {"delete", (PyCFunction)(void (*)(void))q_delete, METH_FASTCALL | METH_KEYWORDS,
     "CmqQueue.delete; the plain case compiled (gateway/broker/_queue.c)."},
    {"restore_plain", (PyCFunction)(void (*)(void))q_restore_plain, METH_FASTCALL | METH_KEYWORDS,
     "CmqQueue.restore_plain; the plain case compiled (gateway/broker/_queue.c)."},
    {NULL, NULL, 0, NULL}};

/* The offsets of a class's plain object slots (member descriptors of type T_OBJECT_EX). */
static int learn(PyTypeObject *t, const char **names_, int n, Py_ssize_t *out) {
    for (int i = 0; i < n; i++) {
        PyObject *d = PyObject_GetAttrString((PyObject *)t, names_[i]);
        if (d == NULL) return -1;
        PyMemberDef *m = Py_IS_TYPE(d, &PyMemberDescr_Type) ? ((PyMemberDescrObject *)d)->d_member : NULL;
        int plain = m != NULL && m->type == T_OBJECT_EX && !(m->flags & READONLY)
                    && PyDescr_TYPE(d) == t;
        Py_DECREF(d);
        if (!plain) {
            PyErr_Format(PyExc_TypeError, "configure: %s.%s is not a plain slot of the class", t->tp_name, names_[i]);
            return -1;
        }
        out[i] = m->offset;
    }
    return 0;
}

static int learn_deque(void) {
    PyObject *collections = PyImport_ImportModule("collections");
    if (collections == NULL) return -1;
    PyObject *d = PyObject_GetAttrString(collections, "deque");
    Py_DECREF(collections);
    if (d == NULL) return -1;
    if (!PyType_Check(d)) goto refuse;
    PyObject *a = PyObject_GetAttrString(d, "append"), *p = PyObject_GetAttrString(d, "popleft");
    int fit = a != NULL && p != NULL && Py_IS_TYPE(a, &PyMethodDescr_Type) && Py_IS_TYPE(p, &PyMethodDescr_Type)
              && ((PyMethodDescrObject *)a)->d_method->ml_flags == METH_O
              && ((PyMethodDescrObject *)p)->d_method->ml_flags == METH_NOARGS;
    if (fit) {
        deque_append = ((PyMethodDescrObject *)a)->d_method->ml_meth;
        deque_popleft = ((PyMethodDescrObject *)p)->d_method->ml_meth;
    }
    Py_XDECREF(a);
    Py_XDECREF(p);
    if (!fit) goto refuse;
    Py_XSETREF(deque_t, (PyTypeObject *)d);
    return 0;
refuse:
    Py_DECREF(d);
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "configure: collections.deque is not as expected");
    return -1;
}

static PyObject *configure(PyObject *module, PyObject *args) {
    PyObject *qt, *mt, *rt, *ps, *pr, *pd;
    PyObject *states, *kinds, *prp;
    Py_ssize_t compact;
    if (!PyArg_ParseTuple(args, "O!O!O!OOOO!O!On:configure", &PyType_Type, &qt, &PyType_Type, &mt, &PyType_Type,
                          &rt, &ps, &pr, &pd, &PyTuple_Type, &states, &PyTuple_Type, &kinds, &prp, &compact))
        return NULL;
    if (PyTuple_GET_SIZE(states) != 4 || PyTuple_GET_SIZE(kinds) != 2) {
        PyErr_SetString(PyExc_TypeError, "configure: states (ACTIVE, INACTIVE, DELETED, REMOVED), kinds "
                        "(_VISIBLE, _DEADLINE)");
        return NULL;
    }
    PyTypeObject *q = (PyTypeObject *)qt, *m = (PyTypeObject *)mt, *r = (PyTypeObject *)rt;
    if (m->tp_alloc == NULL || !PyType_IsSubtype(r, &PyTuple_Type) || r->tp_itemsize != sizeof(PyObject *)) {
        PyErr_SetString(PyExc_TypeError, "configure: QueueMessage an object class, Receipt a tuple class");
        return NULL;
    }
    if (learn(q, q_names, Q_COUNT, q_off) < 0 || learn(m, m_names, M_COUNT, m_off) < 0 || learn_deque() < 0)
        return NULL;
    Py_INCREF(q); Py_XSETREF(queue_t, q);
    Py_INCREF(m); Py_XSETREF(message_t, m);
    Py_INCREF(r); Py_XSETREF(receipt_t, r);
    PyObject **kept[9] = {&py_send, &py_receive, &py_delete, &s_active, &s_inactive, &s_deleted, &s_removed,
                          &kind_visible, &kind_deadline};
    PyObject *given[9] = {ps, pr, pd, PyTuple_GET_ITEM(states, 0), PyTuple_GET_ITEM(states, 1),
                          PyTuple_GET_ITEM(states, 2), PyTuple_GET_ITEM(states, 3), PyTuple_GET_ITEM(kinds, 0),
                          PyTuple_GET_ITEM(kinds, 1)};
    for (int i = 0; i < 9; i++) Py_XSETREF(*kept[i], Py_NewRef(given[i]));
    Py_XSETREF(py_restore_plain, Py_NewRef(prp));
    min_compact = compact;
    PyObject *out = PyDict_New();
    if (out == NULL) return NULL;
    for (PyMethodDef *def = queue_methods; def->ml_name != NULL; def++) {
        PyObject *descr = PyDescr_NewMethod(q, def);
        if (descr == NULL || PyDict_SetItemString(out, def->ml_name, descr) < 0) {
            Py_XDECREF(descr);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(descr);
    }
    return out;
}

static PyMethodDef methods[] = {
    {"configure", configure, METH_VARARGS,
     "configure(CmqQueue, QueueMessage, Receipt, py_send, py_receive, py_delete, states, kinds, "
     "py_restore_plain, min_compact) -> the methods"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_queue", NULL, -1, methods};

PyMODINIT_FUNC PyInit__queue(void) {
    zero = PyLong_FromLong(0);
    s_emptied = PyUnicode_InternFromString("_emptied");
    if (zero == NULL || s_emptied == NULL) return NULL;
    return PyModule_Create(&module);
}
