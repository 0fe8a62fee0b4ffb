"""Page scripts capsule tests run in their pages."""

INDEXED_DB_WRITE = """(owner) => new Promise((done, fail) => {
    const request = indexedDB.open('capsule-store', 1);
    request.onupgradeneeded = () => request.result.createObjectStore('entries');
    request.onerror = () => fail(String(request.error));
    request.onsuccess = () => {
        const tx = request.result.transaction('entries', 'readwrite');
        tx.objectStore('entries').put(owner, 'owner');
        tx.oncomplete = () => { request.result.close(); done(true); };
    };
})"""

WRITE_EVERYTHING = (
    """async (owner) => {
    localStorage.setItem('owner', owner);
    sessionStorage.setItem('owner', owner);
    document.cookie = 'owner=' + owner + '; path=/';
    // Cookies for a parent domain would reach every capsule's site: the browser must refuse them.
    document.cookie = 'parent=' + owner + '; domain=test; path=/';
    document.cookie = 'dotted=' + owner + '; domain=.test; path=/';
    await ("""
    + INDEXED_DB_WRITE
    + """)(owner);
}"""
)
READ_EVERYTHING = """async () => [
    localStorage.length, sessionStorage.length, document.cookie,
    (await indexedDB.databases()).map((d) => d.name)]"""
NOTHING = [0, 0, "", []]
