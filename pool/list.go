package pool

// list is an intrusive doubly linked list of T: every T embeds one link per
// list it can be on, so adding and removing allocate nothing, and removing
// from the middle (a cancelled waiter, a tenant no longer idle) is O(1).
// Waiters queue on it, tenants on the idle lists, the reserved line and the
// fair ring.
type list[T any] struct {
	head, tail *link[T]
	n          int
}

// link is one T's place in one list. v points back at the T, which its
// owner sets once when it creates the T.
type link[T any] struct {
	prev, next *link[T]
	v          *T
}

// front returns the first T, or nil when the list is empty.
func (l *list[T]) front() *T {
	if l.head == nil {
		return nil
	}
	return l.head.v
}

func (l *list[T]) pushBack(e *link[T])  { l.insertBefore(e, nil) }
func (l *list[T]) pushFront(e *link[T]) { l.insertBefore(e, l.head) }

// insertBefore puts e just before at, which is on l, or at the end when at
// is nil.
func (l *list[T]) insertBefore(e, at *link[T]) {
	prev := l.tail
	if at != nil {
		prev, at.prev = at.prev, e
	} else {
		l.tail = e
	}
	e.prev, e.next = prev, at
	if prev != nil {
		prev.next = e
	} else {
		l.head = e
	}
	l.n++
}

// remove takes e, which is on l, off it.
func (l *list[T]) remove(e *link[T]) {
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		l.head = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		l.tail = e.prev
	}
	e.prev, e.next = nil, nil
	l.n--
}

// popFront removes and returns the first T, or nil when the list is empty.
func (l *list[T]) popFront() *T {
	e := l.head
	if e == nil {
		return nil
	}
	l.remove(e)
	return e.v
}
