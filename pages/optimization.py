import streamlit as st

st.title("Optimization lens")
