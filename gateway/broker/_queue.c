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
/* CmqQueue.send as configure made it (enqueue_lean calls q_send directly while it is the class's). */
static PyObject *send_descr, *delete_descr;
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
        if (strcmp(def->ml_name, "send") == 0) Py_XSETREF(send_descr, Py_NewRef(descr));
        if (strcmp(def->ml_name, "delete") == 0) Py_XSETREF(delete_descr, Py_NewRef(descr));
        Py_DECREF(descr);
    }
    return out;
}

/* ---- deliver_run(ch, c, q, now): Broker._dispatch_one's loop -------------------------------
 *
 * Why: with the model's three methods compiled, Channel.deliver and ServerConnection.send_deliver
 * were two of the ~4.5 Python frames of a fanout delivery (scenario 3). Here one dispatch's run
 * of deliveries to a queue's only consumer reads the channel's, session's and connection's
 * attributes once (only Python code changes them, and none runs between two common
 * deliveries) and does each common delivery on slots: the basic.deliver frames
 * (fastpath.append_deliver), the deliver record (emit_values), the Unacked and the counts, in
 * Channel.deliver's order.
 *
 * The reference is gateway.broker.channel.py_deliver_run (which calls Channel.deliver). The
 * common delivery: a Receipt of a QueueMessage whose payload is a Message (not a DiskMessage)
 * with Properties, on an AMQP session (protocol None) whose ServerConnection and channel are
 * open, without receive metadata (queue or consumer), to a consumer that acks. Any other
 * receipt goes to Channel.deliver, after which everything is read again; a consumer of
 * another class makes the whole run py_deliver_run's. */

enum { C_TAG, C_NO_ACK, C_PREFETCH, C_UNACKED, C_RECEIVE_METADATA, C_COUNT };
static const char *c_names[C_COUNT] = {"tag", "no_ack", "prefetch", "unacked", "receive_metadata"};
enum { G_BODY, G_PROPERTIES, G_EXCHANGE, G_ROUTING_KEY, G_COUNT };
static const char *g_names[G_COUNT] = {"body", "properties", "exchange", "routing_key"};
static const char *raw_names[1] = {"raw"};
static Py_ssize_t c_off[C_COUNT], g_off[G_COUNT], raw_off[1];
static PyTypeObject *consumer_t, *gmsg_t, *props_t, *conn_t, *unacked_t;
static PyObject *deliver_row, *append_deliver_f, *chan_open, *conn_open, *py_deliver_run, *one;

enum { A_SESSION, A_NEXT_TAG, A_UNACKED, A_FLOW_ACTIVE, A_CLOSING, A_COMMITTING, A_CHANNEL_PREFETCH, A_TX_ACKS,
       A_NUMBER, A_DELIVER, A_PAUSED, A_CONN, A_PROTOCOL, A_BROKER, A_VHOST_NAME, A_USER, A_PEER, A_EMIT_VALUES,
       A_CHANNELS, A_STATE, A_OUT, A_FRAME_MAX, A_RECEIVE, A_RECEIVE_METADATA, A_NAME, A_COUNT };
static const char *a_names[A_COUNT] = {
    "session", "next_tag", "unacked", "flow_active", "closing", "committing", "channel_prefetch", "tx_acks",
    "number", "deliver", "paused", "conn", "protocol", "broker", "vhost_name", "user", "peer", "emit_values",
    "_channels", "state", "_out", "frame_max", "receive", "receive_metadata", "name"};
static PyObject *attr[A_COUNT];

#define CS(c, i) (*(PyObject **)((char *)(c) + c_off[i]))
#define GS(m, i) (*(PyObject **)((char *)(m) + g_off[i]))

/* An attribute's truth value (-1: an error, as the read or bool() raised it). */
static int truth_of(PyObject *obj, int name) {
    PyObject *v = PyObject_GetAttr(obj, attr[name]);
    if (v == NULL) return -1;
    int t = PyObject_IsTrue(v);
    Py_DECREF(v);
    return t;
}

/* A Consumer slot's value, borrowed (NULL with AttributeError when unset, as Python's read). */
static PyObject *c_slot(PyObject *c, int i) {
    PyObject *v = CS(c, i);
    if (v == NULL) PyErr_Format(PyExc_AttributeError, "'Consumer' object has no attribute '%s'", c_names[i]);
    return v;
}

/* What has_credit's test reads of the channel and session (only Python code changes it: read
 * again after any). */
typedef struct {
    int open;         /* flow_active and not closing, committing or paused */
    int limited;      /* channel_prefetch is set */
    PyObject *limit, *unacked, *tx_acks;  /* owned; the last two only when limited */
} Credit;

static void credit_clear(Credit *k) {
    Py_CLEAR(k->limit);
    Py_CLEAR(k->unacked);
    Py_CLEAR(k->tx_acks);
}

static int credit_load(Credit *k, PyObject *ch, PyObject *session) {
    credit_clear(k);
    int flow, closing, committing, paused;
    if ((flow = truth_of(ch, A_FLOW_ACTIVE)) < 0 || (closing = truth_of(ch, A_CLOSING)) < 0
            || (committing = truth_of(ch, A_COMMITTING)) < 0 || (paused = truth_of(session, A_PAUSED)) < 0)
        return -1;
    k->open = flow && !closing && !committing && !paused;
    if ((k->limit = PyObject_GetAttr(ch, attr[A_CHANNEL_PREFETCH])) == NULL) return -1;
    if ((k->limited = PyObject_IsTrue(k->limit)) < 0) return -1;
    if (k->limited) {
        if ((k->unacked = PyObject_GetAttr(ch, attr[A_UNACKED])) == NULL) return -1;
        if ((k->tx_acks = PyObject_GetAttr(ch, attr[A_TX_ACKS])) == NULL) return -1;
    }
    return 0;
}

/* has_credit's test (W4), its consumer part read from the slots each time. */
static int has_credit(Credit *k, PyObject *c) {
    if (!k->open) return 0;
    PyObject *no_ack = c_slot(c, C_NO_ACK);
    if (no_ack == NULL) return -1;
    int t = PyObject_IsTrue(no_ack);
    if (t < 0) return -1;
    if (!t) {
        PyObject *prefetch = c_slot(c, C_PREFETCH);
        if (prefetch == NULL || (t = PyObject_IsTrue(prefetch)) < 0) return -1;
        if (t) {
            PyObject *unacked = c_slot(c, C_UNACKED);
            if (unacked == NULL || (t = PyObject_RichCompareBool(unacked, prefetch, Py_LT)) <= 0) return t;
        }
    }
    if (k->limited) {
        Py_ssize_t a = PyObject_Size(k->unacked), b;
        if (a < 0 || (b = PyObject_Size(k->tx_acks)) < 0) return -1;
        PyObject *sum = PyLong_FromSsize_t(a + b);
        if (sum == NULL) return -1;
        t = PyObject_RichCompareBool(sum, k->limit, Py_LT);
        Py_DECREF(sum);
        return t;
    }
    return 1;
}

/* What a common delivery needs, read at the first receipt after a (re)start. */
typedef struct {
    int loaded, plain;
    PyObject *unacked, *next_tag, *emit_values, *vhost_name, *user, *peer, *qname, *out, *frame_max, *number,
        *ctag;  /* owned */
} Run;

static void run_clear(Run *r) {
    r->loaded = r->plain = 0;
    Py_CLEAR(r->unacked);
    Py_CLEAR(r->next_tag);
    Py_CLEAR(r->emit_values);
    Py_CLEAR(r->vhost_name);
    Py_CLEAR(r->user);
    Py_CLEAR(r->peer);
    Py_CLEAR(r->qname);
    Py_CLEAR(r->out);
    Py_CLEAR(r->frame_max);
    Py_CLEAR(r->number);
    Py_CLEAR(r->ctag);
}

/* ch.next_tag as the run left it (Python's deliver sets it at each delivery). */
static int run_store(Run *r, PyObject *ch) {
    if (!r->loaded || r->next_tag == NULL) return 0;
    return PyObject_SetAttr(ch, attr[A_NEXT_TAG], r->next_tag);
}

/* An attribute kept in *out (owned), 0 when it could not be read (the delivery is then
 * Channel.deliver's, whose own read raises). */
static int keep(PyObject **out, PyObject *obj, int name) {
    *out = PyObject_GetAttr(obj, attr[name]);
    if (*out == NULL) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

/* Whether the common delivery applies to this run (every read Python's would make; nothing
 * changed). Errors are cleared: Channel.deliver then meets them itself. */
static void run_load(Run *r, PyObject *ch, PyObject *session, PyObject *c, PyObject *q) {
    run_clear(r);
    r->loaded = 1;
    PyObject *conn = NULL, *protocol = NULL, *channels = NULL, *chan = NULL, *state = NULL, *broker = NULL;
    PyObject *v = NULL;
    int t;
    if (!keep(&conn, session, A_CONN) || !Py_IS_TYPE(conn, conn_t)) goto done;
    if (!keep(&protocol, session, A_PROTOCOL) || protocol != Py_None) goto done;
    if (!keep(&v, q, A_RECEIVE_METADATA) || (t = PyObject_IsTrue(v)) != 0) goto done;
    if (CS(c, C_RECEIVE_METADATA) == NULL || PyObject_IsTrue(CS(c, C_RECEIVE_METADATA)) != 0) goto done;
    if (CS(c, C_NO_ACK) == NULL || PyObject_IsTrue(CS(c, C_NO_ACK)) != 0 || CS(c, C_TAG) == NULL) goto done;
    if (!keep(&r->number, ch, A_NUMBER) || !keep(&channels, conn, A_CHANNELS) || !PyDict_CheckExact(channels))
        goto done;
    chan = PyDict_GetItemWithError(channels, r->number);  /* borrowed */
    if (chan == NULL) goto done;
    Py_INCREF(chan);
    if (!keep(&state, chan, A_STATE) || state != chan_open) goto done;
    Py_CLEAR(state);
    if (!keep(&state, conn, A_STATE) || state != conn_open) goto done;
    if (!keep(&r->out, conn, A_OUT) || !PyByteArray_CheckExact(r->out) || !keep(&r->frame_max, conn, A_FRAME_MAX))
        goto done;
    if (!keep(&r->next_tag, ch, A_NEXT_TAG) || !PyLong_CheckExact(r->next_tag)) goto done;
    if (!keep(&r->unacked, ch, A_UNACKED) || !PyDict_CheckExact(r->unacked)) goto done;
    if (!keep(&broker, session, A_BROKER) || !keep(&r->emit_values, broker, A_EMIT_VALUES)) goto done;
    if (!keep(&r->vhost_name, session, A_VHOST_NAME) || !keep(&r->user, session, A_USER)
            || !keep(&r->peer, session, A_PEER) || !keep(&r->qname, q, A_NAME))
        goto done;
    r->ctag = Py_NewRef(CS(c, C_TAG));
    r->plain = 1;
done:
    if (PyErr_Occurred()) PyErr_Clear();  /* a bool() that raised: Channel.deliver's to meet */
    Py_XDECREF(conn);
    Py_XDECREF(protocol);
    Py_XDECREF(channels);
    Py_XDECREF(chan);
    Py_XDECREF(state);
    Py_XDECREF(broker);
    Py_XDECREF(v);
}

/* Channel.deliver(c, q, receipt)'s steps for the common delivery: 1 done, 0 not the common
 * one (nothing changed), -1 an error. */
static int deliver_one(Run *r, PyObject *c, PyObject *q, PyObject *receipt) {
    if (!Py_IS_TYPE(receipt, receipt_t) || PyTuple_GET_SIZE(receipt) != 2) return 0;
    PyObject *qmsg = PyTuple_GET_ITEM(receipt, 0);
    if (!Py_IS_TYPE(qmsg, message_t)) return 0;
    PyObject *msg = MS(qmsg, M_PAYLOAD), *msg_id = MS(qmsg, M_MSG_ID), *rc = MS(qmsg, M_RECEIVE_COUNT);
    if (msg == NULL || !Py_IS_TYPE(msg, gmsg_t) || msg_id == NULL || rc == NULL || !PyLong_CheckExact(rc)) return 0;
    PyObject *props = GS(msg, G_PROPERTIES), *body = GS(msg, G_BODY);
    PyObject *exchange = GS(msg, G_EXCHANGE), *routing_key = GS(msg, G_ROUTING_KEY);
    if (props == NULL || !Py_IS_TYPE(props, props_t) || body == NULL || !PyBytes_CheckExact(body)
            || exchange == NULL || routing_key == NULL)
        return 0;
    PyObject *raw = *(PyObject **)((char *)props + raw_off[0]);
    if (raw == NULL) return 0;

    /* tag = self.next_tag; self.next_tag = tag + 1 */
    PyObject *tag = r->next_tag;
    PyObject *next = PyNumber_Add(tag, one);
    if (next == NULL) return -1;
    r->next_tag = next;  /* the run owns tag's reference until the end of this call */
    int redelivered = PyObject_RichCompareBool(rc, one, Py_GT);
    if (redelivered < 0) goto fail;
    PyObject *frame[10] = {r->out, r->number, r->ctag, tag, redelivered ? Py_True : Py_False, exchange, routing_key,
                           raw, body, r->frame_max};
    PyObject *res = PyObject_Vectorcall(append_deliver_f, frame, 10, NULL);
    if (res == NULL) goto fail;
    Py_DECREF(res);
    PyObject *size = PyLong_FromSsize_t(PyBytes_GET_SIZE(body));
    if (size == NULL) goto fail;
    PyObject *record[8] = {deliver_row, r->vhost_name, r->user, r->peer, r->qname, msg_id, rc, size};
    res = PyObject_Vectorcall(r->emit_values, record, 8, NULL);
    Py_DECREF(size);
    if (res == NULL) goto fail;
    Py_DECREF(res);
    PyObject *u = unacked_t->tp_alloc(unacked_t, 4);
    if (u == NULL) goto fail;
    PyObject *items[4] = {q, receipt, msg_id, c};
    for (int i = 0; i < 4; i++) PyTuple_SET_ITEM(u, i, Py_NewRef(items[i]));
    int set = PyDict_SetItem(r->unacked, tag, u);
    Py_DECREF(u);
    if (set < 0) goto fail;
    PyObject *count = c_slot(c, C_UNACKED);
    if (count == NULL) goto fail;
    PyObject *more = PyNumber_InPlaceAdd(count, one);
    if (more == NULL) goto fail;
    put(&CS(c, C_UNACKED), more);
    Py_DECREF(tag);
    return 1;
fail:
    Py_DECREF(tag);
    return -1;
}

static PyObject *deliver_run(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !Py_IS_TYPE(args[1], consumer_t)) return PyObject_Vectorcall(py_deliver_run, args, nargs, NULL);
    PyObject *ch = args[0], *c = args[1], *q = args[2], *now = args[3];
    PyObject *session = NULL, *receive = NULL, *out = NULL;
    Credit k = {0, 0, NULL, NULL, NULL};
    Run r = {0};
    long delivered = 0, code = 0;
    /* py_deliver_run's reads, in its order: q.receive, ch.deliver (read at a fallback here), ch.session */
    if ((receive = PyObject_GetAttr(q, attr[A_RECEIVE])) == NULL) goto fail;
    if ((session = PyObject_GetAttr(ch, attr[A_SESSION])) == NULL) goto fail;
    if (credit_load(&k, ch, session) < 0) goto fail;
    for (;;) {
        int credit = has_credit(&k, c);
        if (credit < 0) goto fail;
        if (!credit) {
            code = delivered | 2;
            break;
        }
        PyObject *receipt = PyObject_Vectorcall(receive, &now, 1, NULL);
        if (receipt == NULL) goto fail;
        if (receipt == Py_None) {
            Py_DECREF(receipt);
            code = delivered;
            break;
        }
        if (!r.loaded) run_load(&r, ch, session, c, q);
        int done = r.plain ? deliver_one(&r, c, q, receipt) : 0;
        if (done == 0) {
            /* Channel.deliver's: the run's tag first, everything read again after it */
            if (run_store(&r, ch) < 0) {
                Py_DECREF(receipt);
                goto fail;
            }
            run_clear(&r);
            PyObject *call[4] = {ch, c, q, receipt};
            PyObject *res = PyObject_VectorcallMethod(attr[A_DELIVER], call, 4 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
            Py_DECREF(receipt);
            if (res == NULL) goto fail;
            Py_DECREF(res);
            if (credit_load(&k, ch, session) < 0) goto fail;
        } else {
            Py_DECREF(receipt);
            if (done < 0) goto fail;
        }
        delivered = 1;
    }
    if (run_store(&r, ch) < 0) goto fail;
    out = PyLong_FromLong(code);
    goto end;
fail:
    if (r.loaded) {  /* the tags used so far stay used, as Python's deliver left them */
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        if (run_store(&r, ch) < 0) PyErr_Clear();
        PyErr_Restore(et, ev, tb);
    }
end:
    run_clear(&r);
    credit_clear(&k);
    Py_XDECREF(session);
    Py_XDECREF(receive);
    return out;
}

static PyMethodDef deliver_def = {"deliver_run", (PyCFunction)(void (*)(void))deliver_run, METH_FASTCALL,
                                  "deliver_run(ch, c, q, now): gateway.broker.channel.py_deliver_run compiled."};

/* configure_deliver(Consumer, Message, Properties, ServerConnection, Unacked, DELIVER,
 * append_deliver, CHAN_OPEN, CONN_OPEN, py_deliver_run) -> deliver_run; after configure. */
static PyObject *configure_deliver(PyObject *module, PyObject *args) {
    PyObject *ct, *gt, *pt, *nt, *ut, *row, *append, *copen, *nopen, *ref;
    if (!PyArg_ParseTuple(args, "O!O!O!O!O!OOOOO:configure_deliver", &PyType_Type, &ct, &PyType_Type, &gt,
                          &PyType_Type, &pt, &PyType_Type, &nt, &PyType_Type, &ut, &row, &append, &copen, &nopen,
                          &ref))
        return NULL;
    if (message_t == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "configure_deliver: configure first");
        return NULL;
    }
    PyTypeObject *u = (PyTypeObject *)ut;
    if (!PyType_IsSubtype(u, &PyTuple_Type) || u->tp_itemsize != sizeof(PyObject *)) {
        PyErr_SetString(PyExc_TypeError, "configure_deliver: Unacked a tuple class");
        return NULL;
    }
    if (learn((PyTypeObject *)ct, c_names, C_COUNT, c_off) < 0 || learn((PyTypeObject *)gt, g_names, G_COUNT, g_off) < 0
            || learn((PyTypeObject *)pt, raw_names, 1, raw_off) < 0)
        return NULL;
    for (int i = 0; i < A_COUNT; i++) {
        if (attr[i] == NULL && (attr[i] = PyUnicode_InternFromString(a_names[i])) == NULL) return NULL;
    }
    if (one == NULL && (one = PyLong_FromLong(1)) == NULL) return NULL;
    PyTypeObject **types[5] = {&consumer_t, &gmsg_t, &props_t, &conn_t, &unacked_t};
    PyObject *given_t[5] = {ct, gt, pt, nt, ut};
    for (int i = 0; i < 5; i++) {
        Py_INCREF(given_t[i]);
        Py_XSETREF(*types[i], (PyTypeObject *)given_t[i]);
    }
    Py_XSETREF(deliver_row, Py_NewRef(row));
    Py_XSETREF(append_deliver_f, Py_NewRef(append));
    Py_XSETREF(chan_open, Py_NewRef(copen));
    Py_XSETREF(conn_open, Py_NewRef(nopen));
    Py_XSETREF(py_deliver_run, Py_NewRef(ref));
    return PyCFunction_NewEx(&deliver_def, NULL, NULL);
}

/* ---- enqueue_lean(vh, subs, labels, msg, now, expires_at, out, ex_name, fresh) -------------
 *
 * Why: a fanout publish (scenario 3) enqueues one message into 50 queues, each through
 * VHost._route's loop body and EmbeddedMessages.enqueue's frame: after deliver_run, the largest
 * Python work of a delivery. Here the vhost's, broker's and message's attributes are read once
 * a publish (again after any Python call) and each queue's transient enqueue is done in
 * EmbeddedMessages.enqueue's order: the model's send, the enqueue record (emit_values), the
 * message's store key "", then the queue marked for end_batch's dispatch or
 * Broker.after_queue_change.
 *
 * The reference is gateway.broker.vhost.py_enqueue_lean. Here: a message made by this publish
 * (fresh), a Message, the embedded store. A queue that is durable for a persistent message
 * goes to the store's enqueue (or VHost._enqueue while the store is read-only), as there; a
 * CMQError from an enqueue means the queue did not take it (D7). Anything else is the
 * reference's whole. */

enum { E_BODY, E_MSG_ID, E_PERSISTENT, E_KEY, E_COUNT };
static const char *e_names[E_COUNT] = {"body", "msg_id", "persistent", "key"};
static Py_ssize_t e_off[E_COUNT];
static PyTypeObject *emsg_t, *embedded_t;
static PyObject *enqueue_row, *cmq_error, *py_enqueue_lean, *s_empty, *s_msg_id;

enum { B_QUEUES, B_BROKER, B_MESSAGES, B_READ_ONLY, B_EMIT_VALUES, B_NAME, B_BATCH_DEPTH, B_TO_DISPATCH,
       B_ENDPOINT, B_CMQ, B_DURABLE, B_CONSUMERS, B_ON_TICK, B_WAITERS, B_DELETED, B_OUTBOX, B_ROUTED, B_LSN,
       B_ENQUEUE, B_AFTER, B_ENQUEUE_VH, B_SEND, B_COUNT };
static const char *b_names[B_COUNT] = {
    "queues", "broker", "messages", "read_only", "emit_values", "name", "_batch_depth", "_to_dispatch",
    "endpoint", "cmq", "durable", "consumers", "on_tick", "waiters", "deleted", "outbox", "routed", "lsn",
    "enqueue", "after_queue_change", "_enqueue", "send"};
static PyObject *battr[B_COUNT];

#define ES(m, i) (*(PyObject **)((char *)(m) + e_off[i]))

static int btruth(PyObject *obj, int name) {
    PyObject *v = PyObject_GetAttr(obj, battr[name]);
    if (v == NULL) return -1;
    int t = PyObject_IsTrue(v);
    Py_DECREF(v);
    return t;
}

/* What the enqueues read of the broker each time (only Python code changes it). */
typedef struct {
    int read_only, batch_depth;
    PyObject *emit_values, *to_dispatch;  /* owned */
} Fresh;

static void fresh_clear(Fresh *f) {
    Py_CLEAR(f->emit_values);
    Py_CLEAR(f->to_dispatch);
}

/* broker: the vhost's (read_only); mbroker: the store's (EmbeddedMessages.broker). */
static int fresh_load(Fresh *f, PyObject *broker, PyObject *mbroker) {
    fresh_clear(f);
    if ((f->read_only = btruth(broker, B_READ_ONLY)) < 0 || (f->batch_depth = btruth(mbroker, B_BATCH_DEPTH)) < 0)
        return -1;
    if ((f->emit_values = PyObject_GetAttr(mbroker, battr[B_EMIT_VALUES])) == NULL) return -1;
    if ((f->to_dispatch = PyObject_GetAttr(mbroker, battr[B_TO_DISPATCH])) == NULL) return -1;
    return 0;
}

/* A call's result dropped: 1 done, 0 a CMQError (cleared: the queue did not take it), -1 another error. */
static int taken(PyObject *res) {
    if (res != NULL) {
        Py_DECREF(res);
        return 1;
    }
    if (PyErr_ExceptionMatches(cmq_error)) {
        PyErr_Clear();
        return 0;
    }
    return -1;
}

/* EmbeddedMessages.enqueue(vh, q, msg, now, None, expires_at, out_lsn, via, label) for a queue
 * that is not durable for this persistent message: 1 done, 0 a CMQError, -1 another error;
 * *called set when Python code ran (after_queue_change). */
static int enqueue_transient(Fresh *f, PyObject *mbroker, PyObject *vh, PyObject *vname, PyObject *q,
                             PyObject *msg, PyObject *size, PyObject *msg_id_arg, PyObject *now, PyObject *expires_at,
                             PyObject *via, PyObject *label, int *called) {
    PyObject *cmq = PyObject_GetAttr(q, battr[B_CMQ]), *qmsg = NULL, *msg_id = NULL, *qname = NULL, *v = NULL;
    int rc = -1, t;
    if (cmq == NULL) goto done;
    PyObject *send_args[7] = {cmq, msg, size, now, Py_None, msg_id_arg, expires_at};
    if (Py_IS_TYPE(cmq, queue_t) && _PyType_Lookup(queue_t, battr[B_SEND]) == send_descr)
        qmsg = q_send(cmq, send_args + 1, 6, NULL);
    else
        qmsg = PyObject_VectorcallMethod(battr[B_SEND], send_args, 7 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    if (qmsg == NULL) {
        rc = taken(NULL);
        goto done;
    }
    if (Py_IS_TYPE(qmsg, message_t) && MS(qmsg, M_MSG_ID) != NULL)
        msg_id = Py_NewRef(MS(qmsg, M_MSG_ID));
    else if ((msg_id = PyObject_GetAttr(qmsg, s_msg_id)) == NULL) {
        rc = taken(NULL);
        goto done;
    }
    if ((qname = PyObject_GetAttr(q, battr[B_NAME])) == NULL) {
        rc = taken(NULL);
        goto done;
    }
    PyObject *record[7] = {enqueue_row, vname, qname, msg_id, size, via, label};
    if ((rc = taken(PyObject_Vectorcall(f->emit_values, record, 7, NULL))) <= 0) goto done;
    put(&ES(msg, E_KEY), Py_NewRef(s_empty));  /* q.durable and msg.persistent is false here */
    /* after_queue_change's case in a read's publishes (the enqueue's own test, in its order) */
    int lean = f->batch_depth;
    if (lean) {
        if ((t = btruth(q, B_CONSUMERS)) < 0) goto error;
        lean = t;
    }
    if (lean) {
        if ((v = PyObject_GetAttr(q, battr[B_ON_TICK])) == NULL) goto error;
        lean = v != Py_None;
        Py_CLEAR(v);
    }
    if (lean) {
        if ((v = PyObject_GetAttr(q, battr[B_WAITERS])) == NULL) goto error;
        lean = v == Py_None;
        Py_CLEAR(v);
    }
    if (lean) {
        PyObject *cmq2 = PyObject_GetAttr(q, battr[B_CMQ]);
        if (cmq2 == NULL) goto error;
        t = btruth(cmq2, B_OUTBOX);
        Py_DECREF(cmq2);
        if (t < 0) goto error;
        lean = !t;
    }
    if (lean) {
        if ((t = btruth(q, B_DELETED)) < 0) goto error;
        lean = !t;
    }
    if (lean) {
        rc = taken(PyObject_SetItem(f->to_dispatch, q, Py_None) < 0 ? NULL : Py_NewRef(Py_None));
    } else {
        *called = 1;
        PyObject *call[3] = {mbroker, vh, q};
        rc = taken(PyObject_VectorcallMethod(battr[B_AFTER], call, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL));
    }
    goto done;
error:
    rc = taken(NULL);
done:
    Py_XDECREF(cmq);
    Py_XDECREF(qmsg);
    Py_XDECREF(msg_id);
    Py_XDECREF(qname);
    Py_XDECREF(v);
    return rc;
}

static PyObject *enqueue_lean(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 9 || args[8] != Py_True || !Py_IS_TYPE(args[3], emsg_t) || !PyList_CheckExact(args[2])
            || !(PyTuple_CheckExact(args[1]) || PyList_CheckExact(args[1]))
            || PySequence_Fast_GET_SIZE(args[1]) != PyList_GET_SIZE(args[2]))
        return PyObject_Vectorcall(py_enqueue_lean, args, nargs, NULL);
    PyObject *vh = args[0], *subs = args[1], *labels = args[2], *msg = args[3], *now = args[4];
    PyObject *expires_at = args[5], *out = args[6], *via = args[7];
    PyObject *queues = NULL, *broker = NULL, *messages = NULL, *mbroker = NULL, *vname = NULL, *size = NULL;
    PyObject *msg_id_arg = NULL, *failed = NULL, *result = NULL;
    Fresh f = {0, 0, NULL, NULL};
    int routed = 0;
    /* the reference's reads before its loop: vh.queues, vh.broker, broker.messages */
    if ((queues = PyObject_GetAttr(vh, battr[B_QUEUES])) == NULL || (broker = PyObject_GetAttr(vh, battr[B_BROKER])) == NULL
            || (messages = PyObject_GetAttr(broker, battr[B_MESSAGES])) == NULL)
        goto end;
    if (!PyDict_CheckExact(queues) || !Py_IS_TYPE(messages, embedded_t)) {
        result = PyObject_Vectorcall(py_enqueue_lean, args, nargs, NULL);
        goto end;
    }
    PyObject *body = ES(msg, E_BODY), *msg_id = ES(msg, E_MSG_ID), *persistent_o = ES(msg, E_PERSISTENT);
    if (body == NULL || !PyBytes_CheckExact(body) || msg_id == NULL || persistent_o == NULL) {
        result = PyObject_Vectorcall(py_enqueue_lean, args, nargs, NULL);
        goto end;
    }
    int persistent = PyObject_IsTrue(persistent_o), t;
    if (persistent < 0 || (t = PyObject_IsTrue(msg_id)) < 0) goto end;
    msg_id_arg = Py_NewRef(t ? msg_id : Py_None);
    if ((size = PyLong_FromSsize_t(PyBytes_GET_SIZE(body))) == NULL) goto end;
    if ((mbroker = PyObject_GetAttr(messages, battr[B_BROKER])) == NULL || (vname = PyObject_GetAttr(vh, battr[B_NAME])) == NULL)
        goto end;
    if (fresh_load(&f, broker, mbroker) < 0) goto end;
    Py_ssize_t n = PyList_GET_SIZE(labels);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *s = PySequence_Fast_ITEMS(subs)[i], *label = PyList_GET_ITEM(labels, i);
        Py_INCREF(s);
        Py_INCREF(label);
        PyObject *endpoint = PyObject_GetAttr(s, battr[B_ENDPOINT]), *name = NULL, *q = NULL;
        int ok = 0, called = 0;
        if (endpoint == NULL) goto item_fail;
        if (PyTuple_CheckExact(endpoint) && PyTuple_GET_SIZE(endpoint) > 1)
            name = Py_NewRef(PyTuple_GET_ITEM(endpoint, 1));
        else if ((name = PyObject_GetItem(endpoint, one)) == NULL)
            goto item_fail;
        q = PyDict_GetItemWithError(queues, name);
        if (q == NULL && PyErr_Occurred()) goto item_fail;
        Py_XINCREF(q);
        if (q != NULL) {
            int durable = btruth(q, B_DURABLE);
            if (durable < 0) goto item_fail;
            if (durable && persistent && f.read_only) {
                /* VHost._enqueue's (its store_failed discard: the attempt took it) */
                PyObject *call[8] = {vh, q, msg, now, Py_None, out, via, label};
                PyObject *res = PyObject_VectorcallMethod(battr[B_ENQUEUE_VH], call, 8 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
                called = 1;
                if (res == NULL) goto item_fail;
                Py_DECREF(res);
                ok = 1;
                routed = 0;  /* as _enqueue left out.routed: set again at the next enqueue */
            } else if (durable && persistent) {
                /* the store's enqueue (its journal record) */
                PyObject *lsn = PyObject_GetAttr(out, battr[B_LSN]);
                if (lsn == NULL) goto item_fail;
                PyObject *call[10] = {messages, vh, q, msg, now, Py_None, expires_at, lsn, via, label};
                PyObject *res = PyObject_VectorcallMethod(battr[B_ENQUEUE], call, 10 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
                Py_DECREF(lsn);
                called = 1;
                if (res == NULL) {
                    if ((ok = taken(NULL)) < 0) goto item_fail;
                    routed = 0;
                } else {
                    int set = PyObject_SetAttr(out, battr[B_LSN], res);
                    Py_DECREF(res);
                    if (set < 0 || PyObject_SetAttr(out, battr[B_ROUTED], Py_True) < 0) goto item_fail;
                    ok = routed = 1;
                }
            } else {
                ok = enqueue_transient(&f, mbroker, vh, vname, q, msg, size, msg_id_arg, now, expires_at, via, label,
                                       &called);
                if (ok < 0) goto item_fail;
                /* out.lsn = the enqueue's: out.lsn itself, as a transient enqueue leaves it. out.routed
                 * = True: set once while no Python code runs between two enqueues. */
                if (ok && (called || !routed) && PyObject_SetAttr(out, battr[B_ROUTED], Py_True) < 0) goto item_fail;
                routed = ok ? 1 : called ? 0 : routed;
            }
        }
        if (!ok) {
            if (failed == NULL && (failed = PyList_New(0)) == NULL) goto item_fail;
            if (PyList_Append(failed, s) < 0) goto item_fail;
        }
        if (called && fresh_load(&f, broker, mbroker) < 0) goto item_fail;
        Py_DECREF(s);
        Py_DECREF(label);
        Py_XDECREF(endpoint);
        Py_XDECREF(name);
        Py_XDECREF(q);
        continue;
    item_fail:
        Py_DECREF(s);
        Py_DECREF(label);
        Py_XDECREF(endpoint);
        Py_XDECREF(name);
        Py_XDECREF(q);
        goto end;
    }
    result = failed != NULL ? Py_NewRef(failed) : Py_NewRef(Py_None);
end:
    fresh_clear(&f);
    Py_XDECREF(queues);
    Py_XDECREF(broker);
    Py_XDECREF(messages);
    Py_XDECREF(mbroker);
    Py_XDECREF(vname);
    Py_XDECREF(size);
    Py_XDECREF(msg_id_arg);
    Py_XDECREF(failed);
    return result;
}

static PyMethodDef enqueue_def = {"enqueue_lean", (PyCFunction)(void (*)(void))enqueue_lean, METH_FASTCALL,
                                  "enqueue_lean(vh, subs, labels, msg, now, expires_at, out, ex_name, fresh): "
                                  "gateway.broker.vhost.py_enqueue_lean compiled."};

/* configure_enqueue(Message, EmbeddedMessages, ENQUEUE, CMQError, py_enqueue_lean) -> enqueue_lean;
 * after configure. */
static PyObject *configure_enqueue(PyObject *module, PyObject *args) {
    PyObject *mt, *et, *row, *err, *ref;
    if (!PyArg_ParseTuple(args, "O!O!OOO:configure_enqueue", &PyType_Type, &mt, &PyType_Type, &et, &row, &err, &ref))
        return NULL;
    if (queue_t == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "configure_enqueue: configure first");
        return NULL;
    }
    if (learn((PyTypeObject *)mt, e_names, E_COUNT, e_off) < 0) return NULL;
    for (int i = 0; i < B_COUNT; i++) {
        if (battr[i] == NULL && (battr[i] = PyUnicode_InternFromString(b_names[i])) == NULL) return NULL;
    }
    if (one == NULL && (one = PyLong_FromLong(1)) == NULL) return NULL;
    if (s_msg_id == NULL && (s_msg_id = PyUnicode_InternFromString("msg_id")) == NULL) return NULL;
    if (s_empty == NULL && (s_empty = PyUnicode_FromString("")) == NULL) return NULL;
    Py_INCREF(mt);
    Py_XSETREF(emsg_t, (PyTypeObject *)mt);
    Py_INCREF(et);
    Py_XSETREF(embedded_t, (PyTypeObject *)et);
    Py_XSETREF(enqueue_row, Py_NewRef(row));
    Py_XSETREF(cmq_error, Py_NewRef(err));
    Py_XSETREF(py_enqueue_lean, Py_NewRef(ref));
    return PyCFunction_NewEx(&enqueue_def, NULL, NULL);
}

/* ---- ack(session, u): Broker.ack, bound to its broker (bind_ack) -------------------------------
 *
 * Why: after deliver_run and enqueue_lean, Broker.ack was the largest Python frame left a
 * delivery (one ack a delivery, 75 bytecodes). Session.on_acks and Channel.ack call it as
 * ``broker.ack``: the broker's instance attribute made by bind_ack is this function bound to
 * it, so the call costs no Python frame.
 *
 * The reference is Broker.ack itself (an argument other than an Unacked is its whole). Here are
 * its steps in its order, the rare ones as calls of the same Python methods: the model's delete
 * (q_delete directly while it is CmqQueue's), the store's settle (durable, or JetStream's), the
 * ack record (AMQP's, or MQTT's, MQ7) with the latency (gateway.broker.broker.ack_latency's
 * double: its shortcut here for two floats, else that function), or the stale_ack record
 * (Q3), then the queue marked for end_batch's dispatch or Broker.after_queue_change. */

enum { K_DELETED, K_DURABLE, K_MESSAGES, K_SETTLES, K_PROTOCOL, K_CLOCK_NOW, K_CMQ, K_MESSAGE, K_PAYLOAD,
       K_PUBLISHED_AT, K_EMIT_VALUES, K_VHOST_NAME, K_USER, K_PEER, K_NAME, K_BATCH_DEPTH, K_CONSUMERS,
       K_ON_TICK, K_WAITERS, K_OUTBOX, K_N_ACTIVE, K_NEXT_DUE, K_LOCAL, K_TO_DISPATCH, K_AFTER, K_VHOSTS,
       K_VHOST, K_EMIT, K_QUEUE, K_MSG_ID, K_DELETE, K_SETTLE, K_EMIT_ROW, K_COUNT };
static const char *k_names[K_COUNT] = {
    "deleted", "durable", "messages", "settles_transient", "protocol", "clock_now", "cmq", "message", "payload",
    "published_at", "emit_values", "vhost_name", "user", "peer", "name", "_batch_depth", "consumers", "on_tick",
    "waiters", "outbox", "_n_active", "_next_due", "_local_messages", "_to_dispatch", "after_queue_change",
    "vhosts", "vhost", "emit", "queue", "msg_id", "delete", "settle", "emit_row"};
static PyObject *kattr[K_COUNT];
static PyObject *py_ack, *ack_row, *ack_mqtt_row, *round_f, *three, *stale_event, *stale_kwnames, *settle_kwnames;
static PyObject *ack_msg_t, *py_latency;

static int ktruth(PyObject *obj, int name) {
    PyObject *v = PyObject_GetAttr(obj, kattr[name]);
    if (v == NULL) return -1;
    int t = PyObject_IsTrue(v);
    Py_DECREF(v);
    return t;
}

/* Broker.ack's latency of an ack at ``now`` of a message published at ``published``: round(x, 3)
 * of x = (now - published) * 1000.0 by its shortcut (see Broker.ack), or round itself. */
static PyObject *latency_of(PyObject *now_o, PyObject *published) {
    if (!PyFloat_CheckExact(now_o) || !PyFloat_CheckExact(published)) return NULL;  /* caller: Python's */
    double x = (PyFloat_AS_DOUBLE(now_o) - PyFloat_AS_DOUBLE(published)) * 1000.0;
    double y = x * 1000.0;
    double r = floor(y + 0.5);
    if (!isfinite(r)) return NULL;  /* math.floor raises there: Python's */
    if (0.0 <= y && y < 6.8e10 && -0.4999 < y - r && y - r < 0.4999) return PyFloat_FromDouble(r / 1000.0);
    PyObject *xo = PyFloat_FromDouble(x);
    if (xo == NULL) return NULL;
    PyObject *call[2] = {xo, three};
    PyObject *out = PyObject_Vectorcall(round_f, call, 2, NULL);
    Py_DECREF(xo);
    return out;
}

static PyObject *ack_reference(PyObject *broker, PyObject *const *args, Py_ssize_t nargs) {
    PyObject *stack[3];
    if (nargs != 2) {
        PyObject *bound = PyMethod_New(py_ack, broker);
        if (bound == NULL) return NULL;
        PyObject *out = PyObject_Vectorcall(bound, args, nargs, NULL);
        Py_DECREF(bound);
        return out;
    }
    stack[0] = broker;
    stack[1] = args[0];
    stack[2] = args[1];
    return PyObject_Vectorcall(py_ack, stack, 3, NULL);
}

static PyObject *broker_ack(PyObject *broker, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !Py_IS_TYPE(args[1], unacked_t) || PyTuple_GET_SIZE(args[1]) != 4)
        return ack_reference(broker, args, nargs);
    PyObject *session = args[0], *u = args[1];
    PyObject *q = PyTuple_GET_ITEM(u, 0), *handle = PyTuple_GET_ITEM(u, 1), *msg_id = PyTuple_GET_ITEM(u, 2);
    PyObject *messages = NULL, *protocol = NULL, *clock_now = NULL, *now = NULL, *cmq = NULL, *res = NULL;
    PyObject *m = NULL, *msg = NULL, *latency = NULL, *v = NULL, *out = NULL;
    int t;
    Py_INCREF(q);
    Py_INCREF(handle);
    Py_INCREF(msg_id);
    if ((t = ktruth(q, K_DELETED)) != 0) {
        if (t > 0) out = Py_NewRef(Py_None);
        goto end;
    }
    if ((clock_now = PyObject_GetAttr(broker, kattr[K_CLOCK_NOW])) == NULL || (now = PyObject_CallNoArgs(clock_now)) == NULL)
        goto end;
    if ((cmq = PyObject_GetAttr(q, kattr[K_CMQ])) == NULL) goto end;
    PyObject *del[3] = {cmq, handle, now};
    if (Py_IS_TYPE(cmq, queue_t) && _PyType_Lookup(queue_t, kattr[K_DELETE]) == delete_descr)
        res = q_delete(cmq, del + 1, 2, NULL);
    else
        res = PyObject_VectorcallMethod(kattr[K_DELETE], del, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    if (res == NULL || (t = PyObject_IsTrue(res)) < 0) goto end;
    if (t) {
        /* m = handle.message; msg = m.payload */
        if (Py_IS_TYPE(handle, receipt_t) && PyTuple_GET_SIZE(handle) == 2) m = Py_NewRef(PyTuple_GET_ITEM(handle, 0));
        else if ((m = PyObject_GetAttr(handle, kattr[K_MESSAGE])) == NULL) goto end;
        /* if q.durable or self.messages.settles_transient: self.messages.settle(q, m, body_needed=False) */
        if ((t = ktruth(q, K_DURABLE)) < 0) goto end;
        if (!t) {
            if ((messages = PyObject_GetAttr(broker, kattr[K_MESSAGES])) == NULL || (t = ktruth(messages, K_SETTLES)) < 0)
                goto end;
            Py_CLEAR(messages);
        }
        if (t) {
            if ((messages = PyObject_GetAttr(broker, kattr[K_MESSAGES])) == NULL) goto end;
            PyObject *call[4] = {messages, q, m, Py_False};
            PyObject *r = PyObject_VectorcallMethod(kattr[K_SETTLE], call, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                                    settle_kwnames);
            if (r == NULL) goto end;
            Py_DECREF(r);
        }
        if (Py_IS_TYPE(m, message_t) && MS(m, M_PAYLOAD) != NULL) msg = Py_NewRef(MS(m, M_PAYLOAD));
        else if ((msg = PyObject_GetAttr(m, kattr[K_PAYLOAD])) == NULL) goto end;
        if ((t = PyObject_IsInstance(msg, ack_msg_t)) < 0) goto end;
        if (t) {
            if ((v = PyObject_GetAttr(msg, kattr[K_PUBLISHED_AT])) == NULL) goto end;
            latency = latency_of(now, v);
            if (latency == NULL) {
                if (PyErr_Occurred()) goto end;
                /* not two floats, or past math.floor: Broker.ack's own expression decides */
                PyObject *call[2] = {now, v};
                if ((latency = PyObject_Vectorcall(py_latency, call, 2, NULL)) == NULL) goto end;
            }
            Py_CLEAR(v);
        } else {
            latency = Py_NewRef(Py_None);
        }
        /* the ack record: emit_values(ACK, ...) on AMQP, emit_row(ACK_MQTT, ...) on MQTT (MQ7) */
        if ((protocol = PyObject_GetAttr(session, kattr[K_PROTOCOL])) == NULL) goto end;
        PyObject *vals[3] = {NULL, NULL, NULL}, *qname = NULL, *emit = NULL, *r = NULL;
        int ok = (vals[0] = PyObject_GetAttr(session, kattr[K_VHOST_NAME])) != NULL
                 && (vals[1] = PyObject_GetAttr(session, kattr[K_USER])) != NULL
                 && (vals[2] = PyObject_GetAttr(session, kattr[K_PEER])) != NULL
                 && (qname = PyObject_GetAttr(q, kattr[K_NAME])) != NULL;
        if (ok && protocol == Py_None) {
            if ((emit = PyObject_GetAttr(broker, kattr[K_EMIT_VALUES])) != NULL) {
                PyObject *record[7] = {ack_row, vals[0], vals[1], vals[2], qname, msg_id, latency};
                r = PyObject_Vectorcall(emit, record, 7, NULL);
            }
        } else if (ok) {
            PyObject *values = PyTuple_Pack(6, vals[1], vals[2], qname, msg_id, latency, protocol);
            if (values != NULL && (emit = PyObject_GetAttr(broker, kattr[K_EMIT_ROW])) != NULL) {
                PyObject *record[3] = {ack_mqtt_row, vals[0], values};
                r = PyObject_Vectorcall(emit, record, 3, NULL);
            }
            Py_XDECREF(values);
        }
        ok = r != NULL;
        Py_XDECREF(r);
        Py_XDECREF(emit);
        Py_XDECREF(vals[0]);
        Py_XDECREF(vals[1]);
        Py_XDECREF(vals[2]);
        Py_XDECREF(qname);
        if (!ok) goto end;
    } else {
        /* session.emit("stale_ack", queue=q.name, msg_id=u.msg_id) */
        PyObject *qname = PyObject_GetAttr(q, kattr[K_NAME]);
        if (qname == NULL) goto end;
        PyObject *call[4] = {session, stale_event, qname, msg_id};
        PyObject *r = PyObject_VectorcallMethod(kattr[K_EMIT], call, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, stale_kwnames);
        Py_DECREF(qname);
        if (r == NULL) goto end;
        Py_DECREF(r);
    }
    /* after_queue_change's case in a read's acks (Broker.ack's own test, in its order) */
    Py_CLEAR(cmq);
    if ((cmq = PyObject_GetAttr(q, kattr[K_CMQ])) == NULL) goto end;
    int lean = 0;
    if ((t = ktruth(broker, K_BATCH_DEPTH)) < 0) goto end;
    if (t && (t = ktruth(q, K_CONSUMERS)) < 0) goto end;
    if (t) {
        if ((v = PyObject_GetAttr(q, kattr[K_ON_TICK])) == NULL) goto end;
        t = v != Py_None;
        Py_CLEAR(v);
    }
    if (t) {
        if ((v = PyObject_GetAttr(q, kattr[K_WAITERS])) == NULL) goto end;
        t = v == Py_None;
        Py_CLEAR(v);
    }
    if (t) {
        if ((t = ktruth(cmq, K_OUTBOX)) < 0) goto end;
        lean = !t;
    }
    if (lean) {
        /* cmq._n_active or cmq._next_due <= now or not self._local_messages */
        int mark;
        if ((mark = ktruth(cmq, K_N_ACTIVE)) < 0) goto end;
        if (!mark) {
            if ((v = PyObject_GetAttr(cmq, kattr[K_NEXT_DUE])) == NULL || (mark = PyObject_RichCompareBool(v, now, Py_LE)) < 0)
                goto end;
            Py_CLEAR(v);
        }
        if (!mark) {
            if ((t = ktruth(broker, K_LOCAL)) < 0) goto end;
            mark = !t;
        }
        if (mark) {
            if ((v = PyObject_GetAttr(broker, kattr[K_TO_DISPATCH])) == NULL || PyObject_SetItem(v, q, Py_None) < 0)
                goto end;
            Py_CLEAR(v);
        }
    } else {
        /* self.after_queue_change(self.vhosts[q.vhost], q) */
        PyObject *vhosts = PyObject_GetAttr(broker, kattr[K_VHOSTS]), *vname = NULL, *vh = NULL;
        if (vhosts != NULL && (vname = PyObject_GetAttr(q, kattr[K_VHOST])) != NULL) vh = PyObject_GetItem(vhosts, vname);
        Py_XDECREF(vhosts);
        Py_XDECREF(vname);
        if (vh == NULL) goto end;
        PyObject *call[3] = {broker, vh, q};
        PyObject *r = PyObject_VectorcallMethod(kattr[K_AFTER], call, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        Py_DECREF(vh);
        if (r == NULL) goto end;
        Py_DECREF(r);
    }
    out = Py_NewRef(Py_None);
end:
    Py_DECREF(q);
    Py_DECREF(handle);
    Py_DECREF(msg_id);
    Py_XDECREF(messages);
    Py_XDECREF(protocol);
    Py_XDECREF(clock_now);
    Py_XDECREF(now);
    Py_XDECREF(cmq);
    Py_XDECREF(res);
    Py_XDECREF(m);
    Py_XDECREF(msg);
    Py_XDECREF(latency);
    Py_XDECREF(v);
    return out;
}

static PyMethodDef ack_def = {"ack", (PyCFunction)(void (*)(void))broker_ack, METH_FASTCALL,
                              "ack(session, u): Broker.ack compiled, bound to its broker (gateway/broker/_queue.c)."};

/* bind_ack(broker) -> ack(session, u) bound to ``broker`` (its instance attribute ``ack``). */
static PyObject *bind_ack(PyObject *module, PyObject *broker) {
    if (py_ack == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "bind_ack: configure_ack first");
        return NULL;
    }
    return PyCFunction_NewEx(&ack_def, broker, NULL);
}

/* configure_ack(Broker.ack, ACK, ACK_MQTT, Message, ack_latency, round) after configure_deliver. */
static PyObject *configure_ack(PyObject *module, PyObject *args) {
    PyObject *ref, *row, *mrow, *mt, *lat, *rnd;
    if (!PyArg_ParseTuple(args, "OOOO!OO:configure_ack", &ref, &row, &mrow, &PyType_Type, &mt, &lat, &rnd)) return NULL;
    if (unacked_t == NULL || delete_descr == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "configure_ack: configure and configure_deliver first");
        return NULL;
    }
    for (int i = 0; i < K_COUNT; i++) {
        if (kattr[i] == NULL && (kattr[i] = PyUnicode_InternFromString(k_names[i])) == NULL) return NULL;
    }
    if (three == NULL && (three = PyLong_FromLong(3)) == NULL) return NULL;
    if (stale_event == NULL && (stale_event = PyUnicode_InternFromString("stale_ack")) == NULL) return NULL;
    if (stale_kwnames == NULL && (stale_kwnames = Py_BuildValue("(ss)", "queue", "msg_id")) == NULL) return NULL;
    if (settle_kwnames == NULL && (settle_kwnames = Py_BuildValue("(s)", "body_needed")) == NULL) return NULL;
    Py_XSETREF(py_ack, Py_NewRef(ref));
    Py_XSETREF(ack_row, Py_NewRef(row));
    Py_XSETREF(ack_mqtt_row, Py_NewRef(mrow));
    Py_XSETREF(ack_msg_t, Py_NewRef(mt));
    Py_XSETREF(py_latency, Py_NewRef(lat));
    Py_XSETREF(round_f, Py_NewRef(rnd));
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"configure", configure, METH_VARARGS,
     "configure(CmqQueue, QueueMessage, Receipt, py_send, py_receive, py_delete, states, kinds, "
     "py_restore_plain, min_compact) -> the methods"},
    {"configure_deliver", configure_deliver, METH_VARARGS,
     "configure_deliver(Consumer, Message, Properties, ServerConnection, Unacked, DELIVER, append_deliver, "
     "CHAN_OPEN, CONN_OPEN, py_deliver_run) -> deliver_run (after configure)"},
    {"configure_enqueue", configure_enqueue, METH_VARARGS,
     "configure_enqueue(Message, EmbeddedMessages, ENQUEUE, CMQError, py_enqueue_lean) -> enqueue_lean "
     "(after configure)"},
    {"configure_ack", configure_ack, METH_VARARGS,
     "configure_ack(Broker.ack, ACK, ACK_MQTT, Message, ack_latency, round) (after configure_deliver)"},
    {"bind_ack", bind_ack, METH_O, "bind_ack(broker) -> Broker.ack compiled, bound to broker"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_queue", NULL, -1, methods};

PyMODINIT_FUNC PyInit__queue(void) {
    zero = PyLong_FromLong(0);
    s_emptied = PyUnicode_InternFromString("_emptied");
    if (zero == NULL || s_emptied == NULL) return NULL;
    return PyModule_Create(&module);
}
