import json
import time

from Xlib import X, display, error, protocol


def text(value):
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else (value or "")


def windows(conn):
    root = conn.screen().root
    listed = root.get_full_property(conn.intern_atom("_NET_CLIENT_LIST"), X.AnyPropertyType)
    if listed is not None and len(listed.value):
        return [conn.create_resource_object("window", wid) for wid in listed.value]
    found, stack = [], [root]
    while stack:
        try:
            children = stack.pop().query_tree().children
        except error.XError:
            continue
        for child in children:
            try:
                if child.get_attributes().map_state == X.IsViewable and (child.get_wm_name() or child.get_wm_class()):
                    found.append(child)
            except error.XError:
                continue
            stack.append(child)
    return found


def title(conn, window):
    net = window.get_full_property(conn.intern_atom("_NET_WM_NAME"), conn.intern_atom("UTF8_STRING"))
    return text(net.value) if net is not None and net.value else text(window.get_wm_name())


def send(conn, window, atom, data):
    event = protocol.event.ClientMessage(
        window=window, client_type=conn.intern_atom(atom), data=(32, (data + [0, 0, 0, 0, 0])[:5])
    )
    conn.screen().root.send_event(event, event_mask=X.SubstructureRedirectMask | X.SubstructureNotifyMask)


def act(conn, window, action):
    if action == "activate":
        send(conn, window, "_NET_ACTIVE_WINDOW", [2, X.CurrentTime])
        window.map()
        window.configure(stack_mode=X.Above)
        window.set_input_focus(X.RevertToParent, X.CurrentTime)
        return
    supported = conn.screen().root.get_full_property(conn.intern_atom("_NET_SUPPORTED"), X.AnyPropertyType)
    if supported is not None and conn.intern_atom("_NET_CLOSE_WINDOW") in supported.value:
        send(conn, window, "_NET_CLOSE_WINDOW", [X.CurrentTime, 2])
        return
    delete = conn.intern_atom("WM_DELETE_WINDOW")
    if delete in (window.get_wm_protocols() or ()):
        event = protocol.event.ClientMessage(
            window=window, client_type=conn.intern_atom("WM_PROTOCOLS"), data=(32, [delete, X.CurrentTime, 0, 0, 0])
        )
        window.send_event(event)
    else:
        window.kill_client()


def main(args):
    conn = display.Display()
    wanted = args["name"] if args["strict"] else args["name"].lower()
    deadline = time.monotonic() + args["wait"]
    while True:
        for window in windows(conn):
            try:
                name = ".".join(window.get_wm_class() or ()) if args["by_class"] else title(conn, window)
                if (name == wanted) if args["strict"] else (wanted in name.lower()):
                    act(conn, window, args["action"])
                    conn.sync()
                    print(json.dumps({"found": True, "window": window.id, "name": name}))
                    return
            except error.XError:
                continue
        if time.monotonic() >= deadline:
            print(json.dumps({"found": False}))
            return
        time.sleep(0.2)
