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
